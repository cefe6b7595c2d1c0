//! The CUDA driver API as kvblock uses it: calls through cudarc's dynamically loaded bindings,
//! with every failure (an error code, or a library or symbol that cudarc cannot load, which it
//! reports by panicking) turned into a `CudaError` naming the call.

use std::ffi::CStr;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};

/// A failed CUDA call, or CUDA missing from the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaError {
    /// No driver library, no NVRTC library, or no device: the backend cannot run here.
    Unavailable(String),
    /// A call failed: the call and the driver's name and description of the error.
    Call(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Unavailable(m) | CudaError::Call(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CudaError {}

pub type CudaResult<T> = Result<T, CudaError>;

/// Runs `f`, turning a panic (cudarc panics when it cannot load a library or a symbol) into an
/// error that names `what`.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> CudaResult<T>) -> CudaResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied())
                .unwrap_or("no detail");
            Err(CudaError::Unavailable(format!(
                "{what}: the CUDA libraries could not be used ({detail})"
            )))
        }
    }
}

/// The driver's name and description of `code`.
pub fn describe(code: CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls write a pointer to a static string (or leave it null on failure).
    unsafe {
        sys::cuGetErrorName(code, &mut name);
        sys::cuGetErrorString(code, &mut text);
    }
    let read = |p: *const std::ffi::c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: non-null pointers from the driver point to NUL-terminated static strings.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    match (read(name), read(text)) {
        (Some(n), Some(t)) => format!("{n}: {t}"),
        (Some(n), None) => n,
        _ => format!("CUresult {}", code as i32),
    }
}

/// `Ok` for `CUDA_SUCCESS`, else an error naming `call`.
pub fn check(code: CUresult, call: &str) -> CudaResult<()> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Call(format!(
            "{call} failed: {}",
            describe(code)
        )))
    }
}

/// Whether the driver library can be loaded (checked before any other cudarc call, which would
/// panic without it).
pub fn driver_library_present() -> bool {
    // SAFETY: loads and unloads candidate library names; no symbol is called.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Initializes the driver and returns device `ordinal` (checked against the device count).
pub fn device(ordinal: i32) -> CudaResult<CUdevice> {
    if !driver_library_present() {
        return Err(CudaError::Unavailable(
            "no CUDA driver library (libcuda.so.1) on this machine: the CUDA backend needs an \
             NVIDIA driver"
                .into(),
        ));
    }
    guarded("cuInit", || {
        // SAFETY: plain driver calls with out-pointers to locals.
        unsafe {
            let init = sys::cuInit(0);
            if init != CUresult::CUDA_SUCCESS {
                return Err(CudaError::Unavailable(format!(
                    "cuInit failed ({}): no usable NVIDIA GPU or driver",
                    describe(init)
                )));
            }
            let mut count = 0;
            check(sys::cuDeviceGetCount(&mut count), "cuDeviceGetCount")?;
            if count == 0 {
                return Err(CudaError::Unavailable(
                    "no CUDA device on this machine".into(),
                ));
            }
            if ordinal < 0 || ordinal >= count {
                return Err(CudaError::Call(format!(
                    "cuda_device {ordinal} does not exist ({count} device(s))"
                )));
            }
            let mut dev = 0;
            check(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            Ok(dev)
        }
    })
}

/// An integer attribute of a device.
pub fn attribute(dev: CUdevice, attr: sys::CUdevice_attribute) -> CudaResult<i32> {
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    check(
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

/// Makes `ctx` current on the calling thread for the guard's lifetime, restoring the previous
/// context afterwards (engine threads usually have it current already: then nothing happens).
pub struct ContextGuard {
    pushed: bool,
}

impl ContextGuard {
    pub fn enter(ctx: CUcontext) -> CudaResult<ContextGuard> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; `ctx` is a retained primary context.
        unsafe {
            check(sys::cuCtxGetCurrent(&mut current), "cuCtxGetCurrent")?;
            if current == ctx {
                return Ok(ContextGuard { pushed: false });
            }
            check(sys::cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")?;
        }
        Ok(ContextGuard { pushed: true })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context this guard pushed.
            unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_becomes_an_unavailable_error() {
        let e = guarded::<()>("loading", || panic!("Unable to dynamically load libcuda"));
        match e {
            Err(CudaError::Unavailable(m)) => {
                assert!(
                    m.contains("loading") && m.contains("Unable to dynamically load"),
                    "{m}"
                )
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn without_a_driver_the_device_is_unavailable_not_a_crash() {
        if driver_library_present() {
            eprintln!("skipped: a CUDA driver library is present on this machine");
            return;
        }
        assert!(matches!(device(0), Err(CudaError::Unavailable(_))));
    }
}
