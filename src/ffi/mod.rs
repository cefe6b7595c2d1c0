//! The C ABI. No logic lives here: argument validation, conversion to Rust types, one lock per
//! call, and a panic guard on every entry point.
//!
//! The modules below are declared in the order of `include/kvblock.h`: cbindgen emits functions
//! in parse order (and each struct before the first function that reaches it), so the header
//! reads in call order. Keep each declaration in its own group so that rustfmt does not sort them.
#![allow(non_camel_case_types)]
// C entry points take raw pointers by design: null is checked, validity is the C caller's
// documented contract, as for any C library.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

// Status codes and the last-error message.
pub mod status;
// The library's version.
pub mod version;
// Manager configuration, creation and destruction.
pub mod config;
// The pool model: layers, pools, the layer map, pool addresses, bytes per token.
pub mod pools;
// Content digests of requests' multimodal items.
pub mod multimodal;
// Admission of requests, single and batched, and the batch estimate.
pub mod admission;
// Generated tokens: append, decode step, remove, rewind.
pub mod tokens;
// Store for reuse, release, pins.
pub mod store;
// The scheduler's capacity lifecycle: resize, generation and context allocations with their
// reverts, suspend / resume, utilization and stall detection.
pub mod lifecycle;
// Block ids and offset tables.
pub mod tables;
// The scheduling simulation and the scheduler's estimates.
pub mod scheduling;
// Statistics and free-block counts.
pub mod stats;
// Per-iteration statistics.
pub mod iteration_stats;
// Once-per-iteration work and explicit offload and onboard.
pub mod iteration;
// KV cache events.
pub mod events;
// The ZeroMQ event publisher.
pub mod publisher;
// The data path: CUDA streams, transfers, pools.
pub mod cuda;
// Static sizing helpers.
pub mod sizing;
// Inspection and debugging.
pub mod inspect;
// TensorRT-LLM 2026 reuse-tree calls: prefix analysis, lookups by key, truncate, reset, hashes.
pub mod reuse_tree;
// A sequence's beam width and front-detached blocks; block ids to pool rows.
pub mod sequence_info;
// Recurrent state (hybrid models) carried into a sequence's next block.
pub mod recurrent;
// The disk tier below the host tier.
pub mod disk;
// The shared remote tier (Redis / Valkey).
pub mod remote;
// Disaggregated prefill/decode: transfer outcomes, the loopback hub, attaching a transfer
// backend, the blobs the engines exchange, notifications, transfer statistics.
pub mod disagg_transport;
// Attaching a NIXL agent (two engine processes).
pub mod disagg_nixl;
// Disaggregated prefill/decode, the sending side: leases, posting, polling, holds.
pub mod disagg_send;
// Disaggregated prefill/decode, the receiving side: receiving sequences and tickets; row runs.
pub mod disagg_receive;
// The bodies the lower tiers' entry points share (no C functions).
mod lower;

// No C functions: the handle and argument helpers, the C structs and their conversions, and every
// manager entry point under one path.
pub mod handle;
pub mod manager;
pub mod types;
