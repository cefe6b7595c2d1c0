//! The shared remote tier: blocks stored in a distributed key-value store (Redis or Valkey,
//! standalone or a Redis Cluster) so that a prefix one engine computed is reused by the others.
//! `store` is the generic seam (batch exists / get / put by key, per-key results), `redis` its
//! first backend (`conn` and `resp` its bounded connections, `cluster` its routing over a
//! Redis Cluster, `tls` their TLS), `value` the keys and verified values, `workers` the threads
//! that run the batches, `tier` one window's view of the store (what is known present, what is
//! in flight, bounds, counters).

pub mod cluster;
pub mod conn;
pub mod redis;
pub mod resp;
pub mod store;
pub mod tier;
#[cfg(feature = "tls")]
mod tls;
pub mod value;
pub mod workers;

pub use self::redis::{RedisConfig, RedisStore};
pub use store::{ConnectionStats, RemoteStore, StoreError, StoreResult};
pub use tier::{FetchDone, Fetched, Known, RemoteLimits, RemoteStats, RemoteTier, StoreItem};
pub use value::{Namespace, Refusal};
pub use workers::RemoteWorkers;
