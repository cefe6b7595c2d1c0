//! The CUDA backend: pools in GPU memory and pinned host memory, block copies by one batched
//! kernel (`kernels/block_copy.cu`, embedded as CUBINs at build time, or compiled at run time by
//! NVRTC for an architecture not embedded) on the engine's stream or on
//! kvblock's own copy stream ordered by events.
//!
//! Everything goes through cudarc's dynamically loaded bindings, so the library builds and
//! loads on machines without CUDA; creating a CUDA manager there fails with a clear error.
//!
//! Layers: `driver` (error handling, context guard) ← `nvrtc` (kernel compilation) ←
//! `device` (context, module, streams; shared by a manager's windows) ← `engine` (one window's
//! pools and launches); `plan` (descriptors and waves) is pure Rust, tested everywhere.

mod cubins;
mod device;
mod driver;
mod engine;
mod nvrtc;
mod plan;

pub use cubins::{EMBEDDED_CUBINS, EMBEDDED_CUBINS_NOTE};
pub use device::{memory_info, CudaConfig, CudaDevice, TransferMode};
pub use driver::{
    driver_library, driver_library_present, driver_library_supported, version_name, CudaError,
    DriverLibrary, MIN_DRIVER_VERSION,
};
pub use engine::CudaCopyEngine;
pub use nvrtc::{block_copy_cubin, block_copy_origin, nvrtc_library_present, KernelOrigin};
pub use plan::{CopyDescriptor, CopyPlan, PoolAddresses};
