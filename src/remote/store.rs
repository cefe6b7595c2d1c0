//! The generic seam between the remote tier and a distributed store: batches of exists / get /
//! put by key, one result per key. Called from the remote tier's worker threads only, never
//! from a C call; every implementation bounds each batch by its own timeouts. Redis and
//! Valkey are the first backend (`redis`); Mooncake Store or NIXL would sit behind the same
//! trait.

use std::fmt;

/// Why a store operation on a key did not give an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The store is not reachable now (connection refused or dropped, or the client is
    /// waiting out its reconnection backoff): the key is a miss.
    Unavailable(String),
    /// The store did not answer within the timeout.
    Timeout(String),
    /// The store refused our credentials (wrong password, unknown ACL user, no permission).
    Auth(String),
    /// A reply that is not one this command can have (a malformed line or integer, EXISTS
    /// answering other than 0 or 1, a line longer than the reader accepts, a missing CRLF):
    /// the connection is dropped.
    Protocol(String),
    /// A value longer than any this namespace stores (refused at its length, before its bytes
    /// are read, on a standalone server): the connection is dropped.
    Oversized(String),
    /// Any other error the store reported for this key.
    Other(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(m) => write!(f, "store unavailable: {m}"),
            StoreError::Timeout(m) => write!(f, "store timed out: {m}"),
            StoreError::Auth(m) => write!(f, "store refused the credentials: {m}"),
            StoreError::Protocol(m) => write!(f, "store protocol error: {m}"),
            StoreError::Oversized(m) => write!(f, "store reply too large: {m}"),
            StoreError::Other(m) => write!(f, "store error: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

pub type StoreResult<T> = Result<T, StoreError>;

/// Counters a store keeps about its connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionStats {
    /// Connections opened (the first and every reconnection).
    pub connects: u64,
    /// Attempts to connect that failed.
    pub connect_failures: u64,
    /// Batches answered with `Unavailable` at once because the client was backing off.
    pub backoff_refusals: u64,
    /// Connections dropped after a failed exchange (a timeout, a malformed or oversized
    /// reply, a closed connection), idle ones dropped with them included.
    pub drops: u64,
    /// Bytes the bounded readers accepted in reply to batches (and to slot map requests),
    /// connection setup aside.
    pub reply_bytes: u64,
}

/// A distributed key-value store holding sealed blocks.
pub trait RemoteStore: Send + Sync {
    /// Whether each key is present.
    fn exists(&self, keys: &[&[u8]]) -> Vec<StoreResult<bool>>;
    /// The value of each key (`None`: absent); a value longer than `max_len` (the most the
    /// caller stores) is `Oversized`.
    fn get(&self, keys: &[&[u8]], max_len: usize) -> Vec<StoreResult<Option<Vec<u8>>>>;
    /// Writes each value under its key.
    fn put(&self, items: &[(&[u8], &[u8])]) -> Vec<StoreResult<()>>;
    /// Connection counters.
    fn connection_stats(&self) -> ConnectionStats;
    /// A short description for messages (no credentials).
    fn describe(&self) -> String;
}
