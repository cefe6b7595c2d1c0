//! Build step: compiles `kernels/block_copy.cu` to CUBINs for the architectures kvblock ships
//! (`ARCHS`) with a CUDA 12.x NVRTC, and writes `$OUT_DIR/embedded_cubins.rs` listing them, so a
//! machine with only the driver needs no NVRTC at run time.
//!
//! Why a 12.x compiler: every driver from CUDA 12.4 on loads a 12.x CUBIN (minor-version
//! compatibility), while a 13.x compiler's output is not guaranteed to load on a 12.x driver.
//! 12.8 is the first to know sm_100 and sm_120.
//!
//! Where NVRTC comes from: `KVBLOCK_BUILD_NVRTC` (the path of `libnvrtc.so.12`), else the
//! `nvidia-cuda-nvrtc-cu12` wheel that `scripts/setup.sh` installs into `.tools/venv`. Without one
//! the build embeds nothing, says so in a warning, and the library compiles the kernel at run time
//! as before (`src/cuda/nvrtc.rs`).

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};

/// Compute capabilities embedded: A100, A10/RTX 30, L4/L40/RTX 40, H100/H200, B200, RTX 50.
pub const ARCHS: [u32; 6] = [80, 86, 89, 90, 100, 120];

type CreateProgram = unsafe extern "C" fn(
    *mut *mut c_void,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgram = unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int;
type GetSize = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
type GetBytes = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
type DestroyProgram = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// The NVRTC library to compile with, if any.
fn find_nvrtc(manifest_dir: &Path) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KVBLOCK_BUILD_NVRTC") {
        return Some(PathBuf::from(path));
    }
    let lib = manifest_dir.join(".tools/venv/lib");
    std::fs::read_dir(&lib)
        .ok()?
        .filter_map(Result::ok)
        .map(|python| {
            python
                .path()
                .join("site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
        })
        .find(|candidate| candidate.exists())
}

/// NVRTC's functions, from a library loaded for the build.
struct Nvrtc {
    _builtins: Option<libloading::Library>,
    lib: libloading::Library,
}

impl Nvrtc {
    fn load(path: &Path) -> Result<Self, String> {
        // NVRTC loads its builtins library by name at compile time: load it first by path from
        // the same folder, so that the loader finds it already loaded (by its SONAME).
        let builtins = path.parent().and_then(|dir| {
            std::fs::read_dir(dir)
                .ok()?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
                })
                // SAFETY: a library of the NVRTC package; its initialisers are NVIDIA's.
                .and_then(|p| unsafe { libloading::Library::new(p) }.ok())
        });
        // SAFETY: as above.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        Ok(Nvrtc {
            _builtins: builtins,
            lib,
        })
    }

    fn symbol<T: Copy>(&self, name: &[u8]) -> Result<T, String> {
        // SAFETY: the caller names the function's real signature.
        unsafe { self.lib.get::<T>(name) }
            .map(|s| *s)
            .map_err(|e| format!("NVRTC lacks {}: {e}", String::from_utf8_lossy(name)))
    }

    fn version(&self) -> Result<(i32, i32), String> {
        let version: Version = self.symbol(b"nvrtcVersion\0")?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out-pointers to locals.
        unsafe { version(&mut major, &mut minor) };
        Ok((major, minor))
    }

    /// `source` compiled to a CUBIN for `sm_{arch}`.
    fn compile(&self, source: &str, arch: u32) -> Result<Vec<u8>, String> {
        let create: CreateProgram = self.symbol(b"nvrtcCreateProgram\0")?;
        let compile: CompileProgram = self.symbol(b"nvrtcCompileProgram\0")?;
        let cubin_size: GetSize = self.symbol(b"nvrtcGetCUBINSize\0")?;
        let cubin: GetBytes = self.symbol(b"nvrtcGetCUBIN\0")?;
        let log_size: GetSize = self.symbol(b"nvrtcGetProgramLogSize\0")?;
        let log: GetBytes = self.symbol(b"nvrtcGetProgramLog\0")?;
        let destroy: DestroyProgram = self.symbol(b"nvrtcDestroyProgram\0")?;
        let src = CString::new(source).map_err(|_| "the kernel source has a NUL".to_string())?;
        let name = c"block_copy.cu";
        let options = [
            CString::new(format!("--gpu-architecture=sm_{arch}")).expect("no NUL"),
            CString::new("--std=c++17").expect("no NUL"),
        ];
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: NVRTC calls with NUL-terminated strings, out-pointers to locals and buffers of
        // the sizes NVRTC reported; the program is destroyed on every path.
        unsafe {
            let mut program = std::ptr::null_mut();
            let status = create(
                &mut program,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if status != 0 {
                return Err(format!("nvrtcCreateProgram failed ({status})"));
            }
            let result = (|| {
                let status = compile(program, option_ptrs.len() as c_int, option_ptrs.as_ptr());
                if status != 0 {
                    let mut size = 0;
                    log_size(program, &mut size);
                    let mut text = vec![0u8; size.max(1)];
                    log(program, text.as_mut_ptr().cast());
                    return Err(format!(
                        "nvrtcCompileProgram failed ({status}) for sm_{arch}: {}",
                        String::from_utf8_lossy(&text).trim_end_matches('\0')
                    ));
                }
                let mut size = 0;
                if cubin_size(program, &mut size) != 0 {
                    return Err("nvrtcGetCUBINSize failed".to_string());
                }
                let mut bytes = vec![0u8; size];
                if cubin(program, bytes.as_mut_ptr().cast()) != 0 {
                    return Err("nvrtcGetCUBIN failed".to_string());
                }
                Ok(bytes)
            })();
            destroy(&mut program);
            result
        }
    }
}

/// Compiles and writes the CUBINs into `out_dir`; returns the Rust source listing them and a
/// line saying what was embedded (or why nothing was).
fn compile_all(manifest_dir: &Path, out_dir: &Path) -> Result<(String, String), String> {
    let path = find_nvrtc(manifest_dir).ok_or_else(|| {
        "no CUDA 12.x NVRTC found (set KVBLOCK_BUILD_NVRTC to libnvrtc.so.12, or run \
         scripts/setup.sh, which installs the nvidia-cuda-nvrtc-cu12 wheel)"
            .to_string()
    })?;
    let nvrtc = Nvrtc::load(&path)?;
    let (major, minor) = nvrtc.version()?;
    if major != 12 || minor < 8 {
        return Err(format!(
            "{} is NVRTC {major}.{minor}; the embedded CUBINs need a 12.x NVRTC of 12.8 or later \
             (a 13.x compiler's output is not guaranteed to load on a 12.x driver)",
            path.display()
        ));
    }
    let source = std::fs::read_to_string(manifest_dir.join("kernels/block_copy.cu"))
        .map_err(|e| format!("kernels/block_copy.cu: {e}"))?;
    let mut listing = String::from("&[\n");
    for arch in ARCHS {
        let cubin = nvrtc.compile(&source, arch)?;
        let file = out_dir.join(format!("block_copy.sm_{arch}.cubin"));
        std::fs::write(&file, cubin).map_err(|e| format!("{}: {e}", file.display()))?;
        listing.push_str(&format!(
            "    ({arch}, include_bytes!({:?})),\n",
            file.display().to_string()
        ));
    }
    listing.push(']');
    let archs: Vec<String> = ARCHS.iter().map(|a| format!("sm_{a}")).collect();
    let note = format!("NVRTC {major}.{minor}: {}", archs.join(", "));
    Ok((listing, note))
}

/// The build step (see the module documentation).
pub fn embed() {
    println!("cargo:rerun-if-changed=kernels/block_copy.cu");
    println!("cargo:rerun-if-changed=build_support/embed_cubins.rs");
    println!("cargo:rerun-if-env-changed=KVBLOCK_BUILD_NVRTC");
    // scripts/setup.sh writes this file (the NVRTC wheels it installed, or `none` without
    // --tests): a build made before NVRTC was installed (no CUBIN) is redone after it. While it is
    // missing the step reruns on every build, and the crate is compiled again.
    println!("cargo:rerun-if-changed=.tools/nvrtc.done");
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    if let Some(nvrtc) = find_nvrtc(&manifest_dir) {
        println!("cargo:rerun-if-changed={}", nvrtc.display());
    }
    let (listing, note) = match compile_all(&manifest_dir, &out_dir) {
        Ok(done) => done,
        Err(why) => {
            println!("cargo:warning=kvblock embeds no CUBIN: {why}; the CUDA backend will compile its kernel with NVRTC at run time");
            ("&[]".to_string(), format!("none: {why}"))
        }
    };
    let code = format!(
        "/// `(compute capability, CUBIN)` of the block-copy kernel compiled at build time.\n\
         pub static EMBEDDED_CUBINS: &[(u32, &[u8])] = {listing};\n\
         /// What the build embedded, or why it embedded nothing.\n\
         pub const EMBEDDED_CUBINS_NOTE: &str = {note:?};\n"
    );
    let file = out_dir.join("embedded_cubins.rs");
    std::fs::write(&file, code).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
}
