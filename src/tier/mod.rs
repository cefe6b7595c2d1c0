//! Tiers below host memory. The machinery here is generic over where the bytes go: blocks are
//! sealed (`sealed`: full key, prefix digest, checksum), moved by a pool of I/O workers (`io`)
//! through a `TierStore` (`store`: batch put/get by key, one result per key), with bounded
//! queues, claims on what is being read, and verification of everything read back. The disk
//! tier (`disk`) keeps one file of fixed slots per window pool, its space reserved honestly
//! (`prealloc`).

pub mod disk;
pub mod io;
pub mod prealloc;
pub mod sealed;
pub mod store;

pub use disk::{DiskTier, ReadDone, SlotChange, TierLimits, TierStats};
pub use sealed::{prefix_digest, PrefixDigest, SlotLayout, ROOT_DIGEST};
pub use store::{FaultPlan, FileMode, TierKey, TierStore};

/// Which blocks leaving the host tier are written to disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WritePolicy {
    /// Every cached block the host tier evicts (the default: a prefix seen once is what a
    /// returning conversation or agent asks for again).
    #[default]
    All,
    /// Only blocks that were reused at least once while cached (fewer writes, less wear).
    Reused,
}
