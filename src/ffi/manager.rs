//! Every `kvb_manager_*` entry point under one path, for Rust callers (the integration tests and
//! the fuzz target). Each is defined in the module of its concept, in the header's order:
//! `config`, `admission`, `tokens`, `store`, `lifecycle`, `tables`, `scheduling`, `stats`,
//! `iteration`, `recurrent`, `cuda` (pool addresses), `inspect`.

pub use super::admission::*;
pub use super::config::*;
pub use super::cuda::kvb_manager_get_pool_pointer;
pub use super::disagg_receive::*;
pub use super::disagg_send::*;
pub use super::disagg_transport::*;
pub use super::inspect::*;
pub use super::iteration::*;
pub use super::iteration_stats::*;
pub use super::lifecycle::*;
pub use super::recurrent::*;
pub use super::reuse_tree::*;
pub use super::scheduling::*;
pub use super::sequence_info::*;
pub use super::stats::*;
pub use super::store::*;
pub use super::tables::*;
pub use super::tokens::*;
