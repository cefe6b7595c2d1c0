//! kvblock: a KV-cache block manager for LLM inference engines with TensorRT-LLM V1 semantics.
//!
//! Layers (dependencies point downwards): `ffi` → `manager` → `window` → `tree`, `eviction`,
//! `pool`, `transfer` → `key`, `retention`, `error`, `premixed`, `prefetch`; the CUDA backend `cuda` implements
//! `transfer::CopyEngine` and is chosen by `manager` at creation.

pub mod cuda;
pub mod disagg;
pub mod error;
pub mod events;
pub mod eviction;
pub mod ffi;
pub mod key;
pub mod manager;
pub mod pool;
pub mod pool_model;
pub mod prefetch;
pub mod premixed;
pub mod publisher;
pub mod remote;
pub mod retention;
pub mod sizing;
pub mod tier;
pub mod transfer;
pub mod tree;
pub mod window;
