//! A cache-line prefetch hint: eviction touches the metadata and key slot of a block that has
//! not been used for a long time, so allocation asks for the next victims' lines ahead of time.

/// Hints the CPU to bring the cache line holding `value` into all cache levels. Never faults
/// (a prefetch of any address is architecturally a no-op but for caches); does nothing on
/// targets other than x86-64.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints the cache hierarchy; it reads no memory the program can
    // observe and cannot fault, and `value` is a valid reference anyway.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}
