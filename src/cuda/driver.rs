//! The CUDA driver API as kvblock uses it: calls through cudarc's dynamically loaded bindings,
//! with every failure (an error code, or a library or symbol that cudarc cannot load, which it
//! reports by panicking) turned into a `CudaError` naming the call.

use std::ffi::CStr;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::{self, CUcontext, CUdevice, CUresult};

/// The oldest driver kvblock runs on, as `cuDriverGetVersion` reports it (1000 × major + 10 ×
/// minor): CUDA 12.4, the R550 driver branch. Every driver function kvblock calls exists in it.
pub const MIN_DRIVER_VERSION: i32 = 12040;

/// A failed CUDA call, or CUDA missing from the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CudaError {
    /// No driver library, no NVRTC library, a library lacking a function kvblock calls, or no
    /// device: the backend cannot run here.
    Unavailable(String),
    /// The driver library is there but older than [`MIN_DRIVER_VERSION`]; `found` is its
    /// `cuDriverGetVersion`.
    DriverTooOld { found: i32 },
    /// A call failed: the call and the driver's name and description of the error.
    Call(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Unavailable(m) | CudaError::Call(m) => f.write_str(m),
            CudaError::DriverTooOld { found } => write!(
                f,
                "CUDA driver {} ({found}) found; kvblock needs {} ({MIN_DRIVER_VERSION}) or newer \
                 (an NVIDIA driver of the R550 branch or later)",
                version_name(*found),
                version_name(MIN_DRIVER_VERSION)
            ),
        }
    }
}

/// `12040` → `"12.4"`, as NVIDIA writes driver API versions.
pub fn version_name(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

impl std::error::Error for CudaError {}

pub type CudaResult<T> = Result<T, CudaError>;

/// Runs `f`, turning a panic of cudarc's loader (it panics when it cannot load a library, and
/// when a function is first called that the loaded library lacks) into an `Unavailable` error
/// that names `what` and, for a missing function, the function. Any other panic (a bug) goes on
/// unwinding, to be reported as one.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> CudaResult<T>) -> CudaResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            match detail.and_then(|d| loader_panic_message(what, d)) {
                Some(m) => Err(CudaError::Unavailable(m)),
                None => std::panic::resume_unwind(payload),
            }
        }
    }
}

/// The message for a panic of cudarc's loader with `detail` as its payload; `None` for a panic
/// that is not one.
fn loader_panic_message(what: &str, detail: &str) -> Option<String> {
    // cudarc 0.19: `Unable to dynamically load the "cuda" shared library - searched for ...`
    // when no candidate name loads.
    if detail.starts_with("Unable to dynamically load") {
        return Some(format!(
            "{what}: the CUDA libraries could not be used ({detail})"
        ));
    }
    // `Missing symbol {name}: {dlerror}` on the first call of a function the library does not
    // export.
    let rest = detail.strip_prefix("Missing symbol ")?;
    let symbol = rest.split(':').next().unwrap_or(rest).trim();
    Some(if symbol.starts_with("nvrtc") {
        format!(
            "{what}: the NVRTC library lacks the function {symbol}, which kvblock calls (NVRTC \
             may be too old: kvblock needs CUDA 12.4 or newer) ({detail})"
        )
    } else {
        format!(
            "{what}: the CUDA driver library lacks the function {symbol}, which kvblock calls \
             (the driver may be too old: kvblock needs CUDA {} ({MIN_DRIVER_VERSION}) or newer) \
             ({detail})",
            version_name(MIN_DRIVER_VERSION)
        )
    })
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

/// What the probe for the driver library found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverLibrary {
    /// No driver library can be loaded.
    Missing,
    /// A driver library is loaded but cannot say its version (`cuDriverGetVersion` missing or
    /// failing): the reason.
    Unusable(String),
    /// A driver older than [`MIN_DRIVER_VERSION`], with its version.
    TooOld(i32),
    /// A driver kvblock supports, with its version.
    Supported(i32),
}

impl DriverLibrary {
    /// Creating a CUDA manager fails with this error, unless the driver is supported.
    pub fn error(&self) -> Option<CudaError> {
        match self {
            DriverLibrary::Missing => Some(CudaError::Unavailable(
                "no CUDA driver library (libcuda.so.1) on this machine: the CUDA backend needs an \
                 NVIDIA driver"
                    .into(),
            )),
            DriverLibrary::Unusable(m) => Some(CudaError::Unavailable(m.clone())),
            DriverLibrary::TooOld(found) => Some(CudaError::DriverTooOld { found: *found }),
            DriverLibrary::Supported(_) => None,
        }
    }
}

/// Whether a driver library can be loaded, whatever its version (checked before any other
/// cudarc call, which would panic without it). [`driver_library`] tells whether it is usable.
pub fn driver_library_present() -> bool {
    // Loads the driver once and keeps it (cudarc's own handle, which every call uses anyway):
    // loading and unloading it to probe would lose what it allocates when it loads.
    // SAFETY: loads the library by its candidate names; no symbol is called.
    catch_unwind(|| unsafe { sys::culib() }).is_ok()
}

/// Probes the driver library: absent, loaded but unusable, too old, or supported (by its
/// `cuDriverGetVersion`, which needs no `cuInit`).
pub fn driver_library() -> DriverLibrary {
    if !driver_library_present() {
        return DriverLibrary::Missing;
    }
    let version = guarded("cuDriverGetVersion", || {
        let mut v = 0;
        // SAFETY: out-pointer to a local.
        check(
            unsafe { sys::cuDriverGetVersion(&mut v) },
            "cuDriverGetVersion",
        )?;
        Ok(v)
    });
    match version {
        Ok(v) if v >= MIN_DRIVER_VERSION => DriverLibrary::Supported(v),
        Ok(v) => DriverLibrary::TooOld(v),
        Err(e) => DriverLibrary::Unusable(format!("the CUDA driver library cannot be used: {e}")),
    }
}

/// Whether a driver library kvblock supports (CUDA 12.4 or newer) can be loaded.
pub fn driver_library_supported() -> bool {
    matches!(driver_library(), DriverLibrary::Supported(_))
}

/// Checks the driver (present, CUDA 12.4 or newer), initializes it and returns device `ordinal`
/// (checked against the device count).
pub fn device(ordinal: i32) -> CudaResult<CUdevice> {
    if let Some(e) = driver_library().error() {
        return Err(e);
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
        assert_eq!(driver_library(), DriverLibrary::Missing);
        assert!(!driver_library_supported());
        assert!(matches!(device(0), Err(CudaError::Unavailable(_))));
    }

    #[test]
    fn any_other_panic_goes_on_unwinding() {
        let r = catch_unwind(|| guarded::<()>("loading", || panic!("index out of bounds")));
        assert!(r.is_err(), "a bug's panic is not a CUDA error");
    }

    #[test]
    fn a_missing_driver_function_is_named_with_the_version_needed() {
        let e = guarded::<()>("cuInit", || {
            panic!("Missing symbol cuMemAlloc_v2: libcuda.so: undefined symbol: cuMemAlloc_v2")
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("lacks the function cuMemAlloc_v2")
                && e.contains("may be too old")
                && e.contains("12.4 (12040)"),
            "{e}"
        );
        let e = guarded::<()>("NVRTC", || {
            // cudarc formats its message: a `String` payload.
            std::panic::panic_any(String::from(
                "Missing symbol nvrtcGetCUBIN: undefined symbol: nvrtcGetCUBIN",
            ))
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("NVRTC library lacks the function nvrtcGetCUBIN"),
            "{e}"
        );
    }

    #[test]
    fn an_old_driver_is_refused_with_both_versions() {
        assert_eq!(version_name(11080), "11.8");
        assert_eq!(version_name(12040), "12.4");
        assert_eq!(version_name(13010), "13.1");
        let e = DriverLibrary::TooOld(11080).error().unwrap();
        assert_eq!(e, CudaError::DriverTooOld { found: 11080 });
        let m = e.to_string();
        assert!(
            m.starts_with("CUDA driver 11.8 (11080) found; kvblock needs 12.4 (12040) or newer"),
            "{m}"
        );
        assert!(matches!(
            crate::error::KvError::from(e),
            crate::error::KvError::Unsupported(_)
        ));
        assert_eq!(DriverLibrary::Supported(12040).error(), None);
        assert!(matches!(
            DriverLibrary::Missing.error(),
            Some(CudaError::Unavailable(m)) if m.contains("no CUDA driver library")
        ));
    }

    /// Every driver function kvblock calls, each exported by every driver from CUDA 12.4 on
    /// (cudarc binds each one, with one signature, for every CUDA version from 11.4 to 13.4).
    /// cudarc resolves functions on first call, so calling one a 12.4 driver lacks would
    /// compile and fail only on such a driver: a new call must be checked against the 12.4
    /// driver API (cuda.h of CUDA 12.4) before it joins this list.
    const DRIVER_FUNCTIONS_IN_CUDA_12_4: &[&str] = &[
        "cuCtxGetCurrent",
        "cuCtxPopCurrent_v2",
        "cuCtxPushCurrent_v2",
        "cuCtxSetCurrent",
        "cuCtxSynchronize",
        "cuDeviceGet",
        "cuDeviceGetAttribute",
        "cuDeviceGetCount",
        "cuDeviceGetName",
        "cuDevicePrimaryCtxRelease_v2",
        "cuDevicePrimaryCtxRetain",
        "cuDriverGetVersion",
        "cuEventCreate",
        "cuEventDestroy_v2",
        "cuEventQuery",
        "cuEventRecord",
        "cuEventSynchronize",
        "cuGetErrorName",
        "cuGetErrorString",
        "cuInit",
        "cuLaunchKernel",
        "cuMemAlloc_v2",
        "cuMemFreeHost",
        "cuMemFree_v2",
        "cuMemGetInfo_v2",
        "cuMemHostAlloc",
        "cuMemHostGetDevicePointer_v2",
        "cuMemcpyAsync",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
        "cuModuleGetFunction",
        "cuModuleLoadData",
        "cuModuleUnload",
        "cuPointerGetAttribute",
        "cuStreamCreate",
        "cuStreamDestroy_v2",
        "cuStreamSynchronize",
        "cuStreamWaitEvent",
    ];

    /// Functions newer than CUDA 12.4, each called only after `cuDriverGetVersion` says the
    /// driver has it (with the version that introduced it).
    const DRIVER_FUNCTIONS_AFTER_A_VERSION_CHECK: &[&str] = &[
        // benches/gpu_bandwidth.rs: 12.8; older drivers get cuEventElapsedTime.
        "cuEventElapsedTime_v2",
    ];

    #[test]
    fn every_driver_function_kvblock_calls_is_in_cuda_12_4() {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(format!("{root}/src/cuda"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.push(format!("{root}/tests/common/mod.rs").into());
        files.push(format!("{root}/benches/gpu_bandwidth.rs").into());
        let mut seen = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            // Built at run time so this line is not a match itself.
            let needle = format!("{}::cu", "sys");
            for (at, _) in text.match_indices(&needle) {
                let name: String = text[at + "sys::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                // Types (`CUresult`) start with `CU`, functions with `cu`: only calls match.
                // `culib` is cudarc's loader (the library handle), not a driver function.
                if name == "culib" {
                    continue;
                }
                seen += 1;
                assert!(
                    DRIVER_FUNCTIONS_IN_CUDA_12_4.contains(&name.as_str())
                        || DRIVER_FUNCTIONS_AFTER_A_VERSION_CHECK.contains(&name.as_str()),
                    "{} calls {name}, not on the list of driver functions checked against \
                     CUDA 12.4 (see DRIVER_FUNCTIONS_IN_CUDA_12_4)",
                    file.display()
                );
            }
        }
        assert!(seen > 30, "the scan found only {seen} calls");
    }
}
