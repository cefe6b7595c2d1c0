//! The library's version at run time (`kvb_version`), for checking ABI compatibility.

use super::handle::{guard, write_out};
use super::status::kvb_status_t;

/// The version of this library: its ABI major version (the `N` of the SONAME `libkvblock.so.N`),
/// minor and patch. A program built against version `M.m.p` runs against any library of the same
/// major `M` and a minor of at least `m`; compare with what the header was generated for when in
/// doubt. Each out-parameter may be null when that part is not wanted.
#[no_mangle]
pub extern "C" fn kvb_version(
    out_major: *mut u32,
    out_minor: *mut u32,
    out_patch: *mut u32,
) -> kvb_status_t {
    guard(|| {
        let parts = [
            (out_major, env!("CARGO_PKG_VERSION_MAJOR"), "out_major"),
            (out_minor, env!("CARGO_PKG_VERSION_MINOR"), "out_minor"),
            (out_patch, env!("CARGO_PKG_VERSION_PATCH"), "out_patch"),
        ];
        for (out, text, name) in parts {
            if out.is_null() {
                continue;
            }
            // Cargo guarantees numeric version parts.
            write_out(out, text.parse::<u32>().unwrap_or(0), name)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_matches_the_crate() {
        let (mut major, mut minor, mut patch) = (u32::MAX, u32::MAX, u32::MAX);
        assert_eq!(
            kvb_version(&mut major, &mut minor, &mut patch),
            kvb_status_t::KVB_OK
        );
        assert_eq!(
            format!("{major}.{minor}.{patch}"),
            env!("CARGO_PKG_VERSION")
        );
        let mut only_major = u32::MAX;
        assert_eq!(
            kvb_version(&mut only_major, std::ptr::null_mut(), std::ptr::null_mut()),
            kvb_status_t::KVB_OK
        );
        assert_eq!(only_major, major);
    }
}
