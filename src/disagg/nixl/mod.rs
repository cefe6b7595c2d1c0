//! A transfer backend over NIXL (<https://github.com/ai-dynamo/nixl>), the transfer library
//! TensorRT-LLM, vLLM, SGLang and Dynamo use for disaggregated serving; its UCX plugin moves
//! DRAM and VRAM between agents (CMA or TCP on one host, RDMA / NVLink where present).
//!
//! NIXL's C API (`libnixl_capi.so`) is loaded at run time: kvblock builds and runs without it,
//! and `NixlBackend::new` fails with `KvError::Unsupported` naming what it tried when it is
//! missing. Where it comes from: `KVBLOCK_NIXL_LIBRARY` (a full path), else `libnixl_capi.so`
//! on the loader path. `scripts/setup.sh` installs the `nixl-cu12==1.5.1` wheel (its
//! `libnixl_capi.so` finds NIXL, UCX and the plugins through its own RPATH) and
//! `scripts/nixl_env.sh` points the variable at it.
//!
//! Why kvblock's own binding rather than the `nixl-sys` crate:
//! - `nixl-sys` generates its bindings with bindgen at build time, which needs libclang and a
//!   C++ compiler on every machine that builds kvblock; this binding needs neither;
//! - without NIXL installed, `nixl-sys`'s build falls back to stubs silently, and with its
//!   `stub-api` feature a call without the library aborts the process; kvblock must instead
//!   report an error and keep running (as it does when CUDA is missing, `src/cuda`);
//! - kvblock needs 36 of the API's 104 functions (`sys::SYMBOLS`), a table of function pointers
//!   resolved with `libloading`, as for CUDA.
//!
//! Checked against NIXL 1.5.1 (the `nixl-cu12==1.5.1` wheel; its C API declarations for these
//! functions are the same from 1.4.0 to 1.5.2). Files: `sys` (the symbol table and the library
//! lookup), `backend` (`NixlBackend`, the `TransferBackend`).

mod backend;
// Crate-private: the C header generator (cbindgen) would otherwise export its type aliases.
pub(crate) mod sys;

pub use backend::{NixlBackend, NixlConfig};
pub use sys::{LIBRARY_ENV, LIBRARY_NAME, SYMBOLS};
