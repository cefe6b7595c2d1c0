//! The copy kernel for a device: the CUBIN embedded at build time when one runs there
//! (`cubins`), else run-time compilation of `kernels/` with NVRTC, to a CUBIN for the device's
//! own architecture (not PTX: PTX from a newer NVRTC is rejected by an older driver), cached per
//! process.

use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex};

use cudarc::nvrtc::sys::{self, nvrtcProgram, nvrtcResult};

use super::driver::{guarded, CudaError, CudaResult};

/// The batched block-copy kernel, embedded at build time.
pub const BLOCK_COPY_SOURCE: &str = include_str!("../../kernels/block_copy.cu");
/// Its entry point.
pub const BLOCK_COPY_KERNEL: &CStr = c"kvb_copy_blocks";

static CUBINS: Mutex<Vec<(u32, Arc<[u8]>)>> = Mutex::new(Vec::new());

/// Whether the NVRTC library can be loaded. It must be on the loader path (for the
/// `nvidia-cuda-nvrtc` wheel, its `nvidia/cu13/lib`, which also holds the builtins library
/// NVRTC loads at compile time).
pub fn nvrtc_library_present() -> bool {
    // Loads NVRTC once and keeps it (cudarc's own handle, which compiling uses anyway): a probe
    // that loads and unloads it loses what NVRTC allocates when it loads (its C++ runtime's
    // emergency exception pool), which LeakSanitizer reports as a leak.
    // SAFETY: loads the library by its candidate names; no symbol is called.
    std::panic::catch_unwind(|| unsafe { sys::culib() }).is_ok()
}

/// Where a device's copy kernel comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelOrigin {
    /// The CUBIN embedded at build time for this compute capability (it may be an older minor
    /// version of the device's major one).
    Embedded(u32),
    /// Compiled by NVRTC at run time (no embedded CUBIN runs on the device).
    Compiled,
}

/// Where the copy kernel for compute capability `arch` comes from (no compilation happens).
pub fn block_copy_origin(arch: u32) -> KernelOrigin {
    match super::cubins::embedded_cubin(arch) {
        Some((built, _)) => KernelOrigin::Embedded(built),
        None => KernelOrigin::Compiled,
    }
}

/// The block-copy kernel as a CUBIN for compute capability `arch` (e.g. 90 for sm_90): the
/// embedded one when it runs there (no NVRTC needed), else compiled by NVRTC; once per process
/// and architecture.
pub fn block_copy_cubin(arch: u32) -> CudaResult<Arc<[u8]>> {
    let mut cache = CUBINS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, cubin)) = cache.iter().find(|(a, _)| *a == arch) {
        return Ok(cubin.clone());
    }
    let cubin: Arc<[u8]> = match super::cubins::embedded_cubin(arch) {
        Some((_, embedded)) => embedded.into(),
        None => compile_to_cubin(BLOCK_COPY_SOURCE, "block_copy.cu", arch)?.into(),
    };
    cache.push((arch, cubin.clone()));
    Ok(cubin)
}

fn check(code: nvrtcResult, call: &str) -> CudaResult<()> {
    if code == nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(sys::nvrtcGetErrorString(code)) };
    let hint = if code == nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE {
        " (NVRTC's builtins library was not found: put the folder holding libnvrtc and \
         libnvrtc-builtins on the loader path)"
    } else {
        ""
    };
    Err(CudaError::Call(format!(
        "{call} failed: {}{hint}",
        text.to_string_lossy()
    )))
}

/// Owns an NVRTC program so every exit path destroys it.
struct Program(nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: a program created by nvrtcCreateProgram, destroyed once.
        unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

/// Compiles CUDA C++ `source` to a CUBIN for `sm_{arch}`; a compile error carries NVRTC's log.
pub fn compile_to_cubin(source: &str, name: &str, arch: u32) -> CudaResult<Vec<u8>> {
    if !nvrtc_library_present() {
        return Err(CudaError::Unavailable(format!(
            "no embedded CUBIN runs on sm_{arch} (embedded: {}) and no NVRTC library \
             (libnvrtc.so.13 or libnvrtc.so.12) is on the loader path to compile one: install the CUDA toolkit or \
             the nvidia-cuda-nvrtc wheel and add its lib folder to LD_LIBRARY_PATH",
            super::cubins::EMBEDDED_CUBINS_NOTE
        )));
    }
    let src =
        CString::new(source).map_err(|_| CudaError::Call("kernel source has a NUL".into()))?;
    let name = CString::new(name).map_err(|_| CudaError::Call("kernel name has a NUL".into()))?;
    let options: Vec<CString> = [
        format!("--gpu-architecture=sm_{arch}"),
        "--std=c++17".to_string(),
    ]
    .into_iter()
    .map(|o| CString::new(o).expect("options have no NUL"))
    .collect();
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    guarded("NVRTC", || {
        // SAFETY: NVRTC calls with valid NUL-terminated strings and out-pointers to locals; the
        // program is destroyed by `Program`'s drop.
        unsafe {
            let mut raw: nvrtcProgram = std::ptr::null_mut();
            check(
                sys::nvrtcCreateProgram(
                    &mut raw,
                    src.as_ptr(),
                    name.as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                ),
                "nvrtcCreateProgram",
            )?;
            let program = Program(raw);
            let compiled =
                sys::nvrtcCompileProgram(program.0, option_ptrs.len() as i32, option_ptrs.as_ptr());
            if compiled != nvrtcResult::NVRTC_SUCCESS {
                let log = program_log(&program);
                check(compiled, "nvrtcCompileProgram")
                    .map_err(|e| CudaError::Call(format!("{e} for sm_{arch}; log:\n{log}")))?;
            }
            let mut size = 0usize;
            check(
                sys::nvrtcGetCUBINSize(program.0, &mut size),
                "nvrtcGetCUBINSize",
            )?;
            let mut cubin = vec![0u8; size];
            check(
                sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast()),
                "nvrtcGetCUBIN",
            )?;
            Ok(cubin)
        }
    })
}

fn program_log(program: &Program) -> String {
    let mut size = 0usize;
    // SAFETY: size query then a read into a buffer of that size.
    unsafe {
        if sys::nvrtcGetProgramLogSize(program.0, &mut size) != nvrtcResult::NVRTC_SUCCESS {
            return String::new();
        }
        let mut log = vec![0u8; size.max(1)];
        sys::nvrtcGetProgramLog(program.0, log.as_mut_ptr().cast());
        String::from_utf8_lossy(&log)
            .trim_end_matches('\0')
            .trim()
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC present, or the test is skipped; the test script requires it
    /// (`KVBLOCK_REQUIRE_NVRTC`), so CI cannot skip kernel compilation silently.
    fn nvrtc_or_skip() -> bool {
        if nvrtc_library_present() {
            return true;
        }
        assert!(
            std::env::var_os("KVBLOCK_REQUIRE_NVRTC").is_none(),
            "KVBLOCK_REQUIRE_NVRTC is set but libnvrtc.so.13 is not on the loader path"
        );
        eprintln!("skipped: NVRTC (libnvrtc.so.13) is not on the loader path");
        false
    }

    /// Runs on machines without a GPU too: NVRTC needs no device.
    #[test]
    fn block_copy_kernel_compiles_to_an_sm90_cubin() {
        if !nvrtc_or_skip() {
            return;
        }
        let cubin = compile_to_cubin(BLOCK_COPY_SOURCE, "block_copy.cu", 90).expect("compiles");
        assert_eq!(&cubin[..4], b"\x7fELF", "a CUBIN is an ELF image");
    }

    /// An architecture no embedded CUBIN runs on (sm_75: Turing) takes the NVRTC fallback, once
    /// per process; a shipped one needs no NVRTC.
    #[test]
    fn an_architecture_outside_the_embedded_list_falls_back_to_nvrtc() {
        assert_eq!(block_copy_origin(75), KernelOrigin::Compiled);
        if !nvrtc_or_skip() {
            return;
        }
        let cubin = block_copy_cubin(75).expect("the kernel compiles for sm_75");
        assert_eq!(&cubin[..4], b"\x7fELF", "a CUBIN is an ELF image");
        let again = block_copy_cubin(75).unwrap();
        assert!(
            Arc::ptr_eq(&cubin, &again),
            "compiled once per architecture"
        );
        if let KernelOrigin::Embedded(built) = block_copy_origin(90) {
            assert_eq!(built, 90);
            let embedded = block_copy_cubin(90).unwrap();
            assert_eq!(
                &embedded[..],
                super::super::cubins::embedded_cubin(90).unwrap().1
            );
        }
    }

    #[test]
    fn a_compile_error_carries_the_log() {
        if !nvrtc_or_skip() {
            return;
        }
        let err = compile_to_cubin("__global__ void k() { undeclared(); }", "bad.cu", 90)
            .unwrap_err()
            .to_string();
        assert!(err.contains("undeclared"), "{err}");
    }
}
