//! The remote tier of one window: what it knows of the store (blocks seen present or absent),
//! the batches in flight (lookups, fetches, stores), their bounds, and the counters. Every
//! operation here only queues a batch on the worker threads and returns; results are collected
//! by `harvest` in a later call. Values fetched are verified on the worker (`Namespace::verify`)
//! and only verified ones come back as data.
//!
//! Stores are deduplicated three ways: a block this tier wrote (or is writing, or saw present)
//! is not queued again, and the batch asks the store which of its blocks another instance
//! already wrote (pipelined EXISTS) and sends only the others.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::store::{RemoteStore, StoreError};
use super::value::{Namespace, Refusal};
use super::workers::RemoteWorkers;
use crate::tier::io::lock;
use crate::tier::sealed::{OwnedKey, PrefixDigest, SlotHeader};

/// Bounds of a remote tier (per window).
#[derive(Clone, Copy, Debug)]
pub struct RemoteLimits {
    /// Blocks queued or being written before stores are dropped (counted).
    pub max_writes_queued: usize,
    /// Blocks being fetched before fetches are refused (counted).
    pub max_reads_in_flight: usize,
    /// Keys being looked up before lookups are refused (counted).
    pub max_lookups_in_flight: usize,
    /// How long a block found absent is not asked about again (another instance may write it).
    pub absent_ttl_ms: u64,
    /// How long a block whose lookup or fetch failed (store down, timeout) is not asked about
    /// again.
    pub failed_ttl_ms: u64,
    /// How long a block whose value was refused is not fetched again (the bad value stays in
    /// the store until someone overwrites it).
    pub refused_ttl_ms: u64,
    /// Blocks remembered as present or written (dedup and prefetch); forgotten all at once
    /// past this.
    pub max_known: usize,
}

impl Default for RemoteLimits {
    fn default() -> Self {
        RemoteLimits {
            max_writes_queued: 256,
            max_reads_in_flight: 256,
            max_lookups_in_flight: 4096,
            absent_ttl_ms: 1000,
            failed_ttl_ms: 1000,
            refused_ttl_ms: 60_000,
            max_known: 1 << 20,
        }
    }
}

/// Counters of the remote tier (cumulative unless marked as a gauge).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Keys asked about (pipelined EXISTS) and how many were present.
    pub lookups: u64,
    pub lookup_hits: u64,
    /// Lookups refused because too many keys were being looked up.
    pub lookup_drops: u64,
    /// Blocks fetched (GET), and of those verified and returned.
    pub fetches: u64,
    pub fetched: u64,
    pub fetch_bytes: u64,
    /// Blocks fetched, verified and placed in the host tier (remote hits).
    pub hits: u64,
    /// Verified blocks not placed (their parent left meanwhile, or the block was recomputed).
    pub fetches_discarded: u64,
    /// Fetches refused because the fetches in flight were at their bound.
    pub fetch_drops: u64,
    /// Fetched keys that were absent (evicted or expired since the lookup).
    pub fetch_misses: u64,
    /// Values refused: not a value of this namespace's length (truncated, padded, another
    /// geometry), no header of ours (garbage), another namespace, a header / digest / checksum
    /// that does not verify, another block's value. Their sum is `verify_failures()`.
    pub refused_length: u64,
    pub refused_garbage: u64,
    pub refused_namespace: u64,
    pub refused_corrupt: u64,
    pub refused_key: u64,
    /// Blocks written, and their bytes.
    pub writes: u64,
    pub write_bytes: u64,
    /// Stores not sent because the block was written, being written or known present here
    /// (`write_skips`) or found present in the store (`write_dedup_remote`).
    pub write_skips: u64,
    pub write_dedup_remote: u64,
    /// Stores dropped because the write queue was full.
    pub write_drops: u64,
    /// Stores the write policy declined (block key too large for a value header).
    pub policy_skips: u64,
    /// Keys whose operation failed: the store unreachable or backing off (or the connection
    /// closed mid-reply), the batch's deadline passed, a refused credential, a malformed reply
    /// (`errors_protocol`), a value longer than this namespace's (`errors_oversized`), another
    /// error. A key after a reply that broke its connection gets that reply's error.
    pub errors_unavailable: u64,
    pub errors_timeout: u64,
    pub errors_auth: u64,
    pub errors_other: u64,
    pub errors_protocol: u64,
    pub errors_oversized: u64,
    /// Gauges: keys being looked up, blocks being fetched, blocks queued or being written.
    pub lookups_in_flight: u64,
    pub fetches_in_flight: u64,
    pub writes_queued: u64,
    /// Round-trip latency of the batches finished so far (microseconds, over the last 1024).
    pub lookup_p50_us: u64,
    pub lookup_p99_us: u64,
    pub fetch_p50_us: u64,
    pub fetch_p99_us: u64,
    pub store_p50_us: u64,
    pub store_p99_us: u64,
}

impl RemoteStats {
    /// Values refused for any reason.
    pub fn verify_failures(&self) -> u64 {
        self.refused_length
            + self.refused_garbage
            + self.refused_namespace
            + self.refused_corrupt
            + self.refused_key
    }

    /// Keys whose operation failed for any reason.
    pub fn errors(&self) -> u64 {
        self.errors_unavailable
            + self.errors_timeout
            + self.errors_auth
            + self.errors_other
            + self.errors_protocol
            + self.errors_oversized
    }

    /// Adds `o`'s counters (latencies: the larger of each).
    pub fn add(&mut self, o: &RemoteStats) {
        macro_rules! sum {
            ($($f:ident),*) => { $(self.$f += o.$f;)* };
        }
        macro_rules! max {
            ($($f:ident),*) => { $(self.$f = self.$f.max(o.$f);)* };
        }
        sum!(
            lookups,
            lookup_hits,
            lookup_drops,
            fetches,
            fetched,
            fetch_bytes,
            hits,
            fetches_discarded,
            fetch_drops,
            fetch_misses,
            refused_length,
            refused_garbage,
            refused_namespace,
            refused_corrupt,
            refused_key,
            writes,
            write_bytes,
            write_skips,
            write_dedup_remote,
            write_drops,
            policy_skips,
            errors_unavailable,
            errors_timeout,
            errors_auth,
            errors_other,
            errors_protocol,
            errors_oversized,
            lookups_in_flight,
            fetches_in_flight,
            writes_queued
        );
        max!(
            lookup_p50_us,
            lookup_p99_us,
            fetch_p50_us,
            fetch_p99_us,
            store_p50_us,
            store_p99_us
        );
    }
}

/// What a fetch of one block gave.
#[derive(Debug)]
pub enum Fetched {
    /// Verified: the header and the whole value (`Namespace::row` gives the row).
    Block(Box<SlotHeader>, Vec<u8>),
    /// Absent, failed or refused (counted).
    Miss,
}

/// A finished fetch.
#[derive(Debug)]
pub struct FetchDone {
    pub digest: PrefixDigest,
    pub fetched: Fetched,
}

/// One block to store: its digest, its parent's, its key and its value buffer
/// (`Namespace::new_value`) with the row in place; the header is sealed on a worker.
#[derive(Debug)]
pub struct StoreItem {
    pub digest: PrefixDigest,
    pub parent: PrefixDigest,
    pub key: OwnedKey,
    pub value: Vec<u8>,
}

enum Done {
    Looked(Vec<(PrefixDigest, Result<bool, StoreError>)>),
    Fetched(Vec<(PrefixDigest, FetchResult)>),
    Stored(Vec<(PrefixDigest, StoreResult)>),
}

enum FetchResult {
    Block(Box<SlotHeader>, Vec<u8>),
    Absent,
    /// The store failed (counted on the worker).
    Failed,
    Refused(Refusal),
}

enum StoreResult {
    Written(usize),
    AlreadyThere,
    /// The store failed (counted on the worker).
    Failed,
}

const SAMPLES: usize = 1024;

/// Latency samples of one kind of batch (a ring).
#[derive(Default)]
struct Samples {
    us: Vec<u64>,
    next: usize,
}

impl Samples {
    fn push(&mut self, v: u64) {
        if self.us.len() < SAMPLES {
            self.us.push(v);
        } else {
            self.us[self.next] = v;
        }
        self.next = (self.next + 1) % SAMPLES;
    }

    fn percentiles(&self) -> (u64, u64) {
        if self.us.is_empty() {
            return (0, 0);
        }
        let mut v = self.us.clone();
        v.sort_unstable();
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        (at(0.5), at(0.99))
    }
}

#[derive(Default)]
struct Shared {
    done: Mutex<Vec<Done>>,
    lookup_us: Mutex<Samples>,
    fetch_us: Mutex<Samples>,
    store_us: Mutex<Samples>,
    /// Keys answered with each error kind (counted on the workers).
    errors: [AtomicU64; 6],
}

impl Shared {
    fn count_error(&self, e: &StoreError) {
        let i = match e {
            StoreError::Unavailable(_) => 0,
            StoreError::Timeout(_) => 1,
            StoreError::Auth(_) => 2,
            StoreError::Other(_) => 3,
            StoreError::Protocol(_) => 4,
            StoreError::Oversized(_) => 5,
        };
        self.errors[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The remote tier of one window.
pub struct RemoteTier {
    ns: Arc<Namespace>,
    store: Arc<dyn RemoteStore>,
    workers: Arc<RemoteWorkers>,
    shared: Arc<Shared>,
    limits: RemoteLimits,
    /// Blocks known to be in the store (seen present, fetched, or written by this tier).
    present: HashSet<PrefixDigest>,
    /// Blocks found absent, and until when that answer stands (ms of the tier's clock).
    absent: HashMap<PrefixDigest, u64>,
    looking_up: HashSet<PrefixDigest>,
    fetching: HashSet<PrefixDigest>,
    writing: HashSet<PrefixDigest>,
    /// Stores accepted by this call, sent together by `store_staged`.
    staged: Vec<StoreItem>,
    clock: Instant,
    stats: RemoteStats,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteTier")
            .field("store", &self.store.describe())
            .field("stats", &self.stats)
            .finish()
    }
}

/// What the tier knows of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    Present,
    Absent,
    /// Being looked up.
    Pending,
    Unknown,
}

impl RemoteTier {
    pub fn new(
        ns: Namespace,
        store: Arc<dyn RemoteStore>,
        workers: Arc<RemoteWorkers>,
        limits: RemoteLimits,
    ) -> Self {
        RemoteTier {
            ns: Arc::new(ns),
            store,
            workers,
            shared: Arc::new(Shared::default()),
            limits,
            present: HashSet::new(),
            absent: HashMap::new(),
            looking_up: HashSet::new(),
            fetching: HashSet::new(),
            writing: HashSet::new(),
            staged: Vec::new(),
            clock: Instant::now(),
            stats: RemoteStats::default(),
        }
    }

    pub fn namespace(&self) -> &Namespace {
        &self.ns
    }

    fn now_ms(&self) -> u64 {
        self.clock.elapsed().as_millis() as u64
    }

    /// The counters, with the workers' error counts and latency percentiles.
    pub fn stats(&self) -> RemoteStats {
        let mut s = self.stats;
        let e = &self.shared.errors;
        s.errors_unavailable = e[0].load(Ordering::Relaxed);
        s.errors_timeout = e[1].load(Ordering::Relaxed);
        s.errors_auth = e[2].load(Ordering::Relaxed);
        s.errors_other = e[3].load(Ordering::Relaxed);
        s.errors_protocol = e[4].load(Ordering::Relaxed);
        s.errors_oversized = e[5].load(Ordering::Relaxed);
        (s.lookup_p50_us, s.lookup_p99_us) = lock(&self.shared.lookup_us).percentiles();
        (s.fetch_p50_us, s.fetch_p99_us) = lock(&self.shared.fetch_us).percentiles();
        (s.store_p50_us, s.store_p99_us) = lock(&self.shared.store_us).percentiles();
        s
    }

    pub fn stats_mut(&mut self) -> &mut RemoteStats {
        &mut self.stats
    }

    /// What the tier knows of `digest` now.
    pub fn known(&self, digest: &PrefixDigest) -> Known {
        if self.present.contains(digest) {
            Known::Present
        } else if self.looking_up.contains(digest) {
            Known::Pending
        } else if self
            .absent
            .get(digest)
            .is_some_and(|&until| until > self.now_ms())
        {
            Known::Absent
        } else {
            Known::Unknown
        }
    }

    pub fn is_fetching(&self, digest: &PrefixDigest) -> bool {
        self.fetching.contains(digest)
    }

    /// Whether anything is in flight.
    pub fn busy(&self) -> bool {
        !self.looking_up.is_empty() || !self.fetching.is_empty() || !self.writing.is_empty()
    }

    fn remember_present(&mut self, d: PrefixDigest) {
        if self.present.len() >= self.limits.max_known {
            self.present.clear();
        }
        self.present.insert(d);
        self.absent.remove(&d);
    }

    /// Queues one pipelined lookup of the blocks of `digests` the tier knows nothing about
    /// (one request's prefix). Returns the keys asked; 0 when none was unknown or the bound
    /// refused (counted).
    pub fn lookup(&mut self, digests: &[PrefixDigest]) -> usize {
        let ask: Vec<PrefixDigest> = digests
            .iter()
            .filter(|d| self.known(d) == Known::Unknown)
            .copied()
            .collect();
        if ask.is_empty() {
            return 0;
        }
        if self.looking_up.len() + ask.len() > self.limits.max_lookups_in_flight {
            self.stats.lookup_drops += ask.len() as u64;
            return 0;
        }
        self.looking_up.extend(ask.iter().copied());
        self.stats.lookups += ask.len() as u64;
        let (store, ns, shared) = (self.store.clone(), self.ns.clone(), self.shared.clone());
        let n = ask.len();
        self.workers.submit(
            true,
            Box::new(move || {
                let keys: Vec<Vec<u8>> = ask.iter().map(|d| ns.key(d)).collect();
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let t = Instant::now();
                let res = store.exists(&refs);
                lock(&shared.lookup_us).push(t.elapsed().as_micros() as u64);
                for r in res.iter().filter_map(|r| r.as_ref().err()) {
                    shared.count_error(r);
                }
                lock(&shared.done).push(Done::Looked(ask.into_iter().zip(res).collect()));
            }),
        );
        n
    }

    /// Queues one pipelined fetch of `digests` (blocks known present). False (counted) when
    /// the fetches in flight would pass their bound; the caller then fetches fewer.
    pub fn fetch(&mut self, digests: &[PrefixDigest]) -> bool {
        if digests.is_empty() {
            return true;
        }
        if self.fetching.len() + digests.len() > self.limits.max_reads_in_flight {
            self.stats.fetch_drops += digests.len() as u64;
            return false;
        }
        self.fetching.extend(digests.iter().copied());
        self.stats.fetches += digests.len() as u64;
        let (store, ns, shared) = (self.store.clone(), self.ns.clone(), self.shared.clone());
        let want = digests.to_vec();
        self.workers.submit(
            true,
            Box::new(move || {
                let keys: Vec<Vec<u8>> = want.iter().map(|d| ns.key(d)).collect();
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let t = Instant::now();
                // The exact size of our values: a longer reply is refused at its length.
                let res = store.get(&refs, ns.value_len());
                lock(&shared.fetch_us).push(t.elapsed().as_micros() as u64);
                let out = want
                    .into_iter()
                    .zip(res)
                    .map(|(d, r)| {
                        let f = match r {
                            Err(e) => {
                                shared.count_error(&e);
                                FetchResult::Failed
                            }
                            Ok(None) => FetchResult::Absent,
                            Ok(Some(v)) => match ns.verify(&v, &d) {
                                Ok(h) => FetchResult::Block(Box::new(h), v),
                                Err(why) => FetchResult::Refused(why),
                            },
                        };
                        (d, f)
                    })
                    .collect();
                lock(&shared.done).push(Done::Fetched(out));
            }),
        );
        true
    }

    /// Whether a store of `digest` would be sent (not written, being written or known present
    /// here); counts a skip when not.
    pub fn wants(&mut self, digest: &PrefixDigest) -> bool {
        if self.writing.contains(digest) || self.present.contains(digest) {
            self.stats.write_skips += 1;
            return false;
        }
        true
    }

    /// Whether the write queue has room for one more block beside those staged; counts a drop
    /// when not.
    pub fn has_write_room(&mut self) -> bool {
        if self.writing.len() + self.staged.len() >= self.limits.max_writes_queued {
            self.stats.write_drops += 1;
            return false;
        }
        true
    }

    /// Stages a store (accepted by `wants` and `has_write_room`) for the next `store_staged`.
    pub fn stage(&mut self, item: StoreItem) {
        self.staged.push(item);
    }

    /// Queues the staged stores as one batch.
    pub fn store_staged(&mut self) {
        let items = std::mem::take(&mut self.staged);
        self.store(items);
    }

    /// Queues one batch of stores (each already accepted by `wants` and `has_write_room`).
    /// The worker seals each block, asks which are already in the store and writes the others.
    pub fn store(&mut self, items: Vec<StoreItem>) {
        if items.is_empty() {
            return;
        }
        self.writing.extend(items.iter().map(|i| i.digest));
        self.stats.writes_queued = self.writing.len() as u64;
        let (store, ns, shared) = (self.store.clone(), self.ns.clone(), self.shared.clone());
        self.workers.submit(
            false,
            Box::new(move || {
                let keys: Vec<Vec<u8>> = items.iter().map(|i| ns.key(&i.digest)).collect();
                let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let t = Instant::now();
                let there = store.exists(&refs);
                let mut out: Vec<(PrefixDigest, StoreResult)> = Vec::with_capacity(items.len());
                let mut send = Vec::new();
                for (i, (item, e)) in items.iter().zip(there).enumerate() {
                    match e {
                        Ok(true) => out.push((item.digest, StoreResult::AlreadyThere)),
                        // Unknown (the lookup failed): try the write; it fails the same way
                        // when the store is down.
                        Ok(false) | Err(_) => send.push(i),
                    }
                }
                let mut items = items;
                for &i in &send {
                    let it = &mut items[i];
                    ns.seal(&mut it.value, &it.parent, &it.key.as_ref());
                }
                let values: Vec<&Vec<u8>> = send.iter().map(|&i| &items[i].value).collect();
                let batch: Vec<(&[u8], &[u8])> = send
                    .iter()
                    .zip(&values)
                    .map(|(&i, v)| (keys[i].as_slice(), v.as_slice()))
                    .collect();
                let res = store.put(&batch);
                lock(&shared.store_us).push(t.elapsed().as_micros() as u64);
                for ((&i, r), v) in send.iter().zip(res).zip(&values) {
                    let s = match r {
                        Ok(()) => StoreResult::Written(v.len()),
                        Err(e) => {
                            shared.count_error(&e);
                            StoreResult::Failed
                        }
                    };
                    out.push((items[i].digest, s));
                }
                lock(&shared.done).push(Done::Stored(out));
            }),
        );
    }

    /// Collects finished batches: lookups and stores update what the tier knows; finished
    /// fetches are returned (verified blocks with their bytes, the rest as misses, counted).
    pub fn harvest(&mut self) -> Vec<FetchDone> {
        let finished: Vec<Done> = std::mem::take(&mut *lock(&self.shared.done));
        let now = self.now_ms();
        let mut fetched = Vec::new();
        for d in finished {
            match d {
                Done::Looked(res) => {
                    for (digest, r) in res {
                        self.looking_up.remove(&digest);
                        match r {
                            Ok(true) => {
                                self.stats.lookup_hits += 1;
                                self.remember_present(digest);
                            }
                            Ok(false) => {
                                self.absent.insert(digest, now + self.limits.absent_ttl_ms);
                            }
                            // Not asked again at once while the store is down.
                            Err(_) => {
                                self.absent.insert(digest, now + self.limits.failed_ttl_ms);
                            }
                        }
                    }
                }
                Done::Fetched(res) => {
                    for (digest, r) in res {
                        self.fetching.remove(&digest);
                        let f = match r {
                            FetchResult::Block(h, v) => {
                                self.stats.fetched += 1;
                                self.stats.fetch_bytes += v.len() as u64;
                                Fetched::Block(h, v)
                            }
                            FetchResult::Absent => {
                                self.stats.fetch_misses += 1;
                                self.forget(&digest, now + self.limits.absent_ttl_ms);
                                Fetched::Miss
                            }
                            FetchResult::Failed => {
                                self.forget(&digest, now + self.limits.failed_ttl_ms);
                                Fetched::Miss
                            }
                            FetchResult::Refused(why) => {
                                match why {
                                    Refusal::WrongLength => self.stats.refused_length += 1,
                                    Refusal::NotAValue => self.stats.refused_garbage += 1,
                                    Refusal::OtherNamespace => self.stats.refused_namespace += 1,
                                    Refusal::Corrupt => self.stats.refused_corrupt += 1,
                                    Refusal::OtherKey => self.stats.refused_key += 1,
                                }
                                self.forget(&digest, now + self.limits.refused_ttl_ms);
                                Fetched::Miss
                            }
                        };
                        fetched.push(FetchDone { digest, fetched: f });
                    }
                }
                Done::Stored(res) => {
                    for (digest, r) in res {
                        self.writing.remove(&digest);
                        match r {
                            StoreResult::Written(bytes) => {
                                self.stats.writes += 1;
                                self.stats.write_bytes += bytes as u64;
                                self.remember_present(digest);
                            }
                            StoreResult::AlreadyThere => {
                                self.stats.write_dedup_remote += 1;
                                self.remember_present(digest);
                            }
                            StoreResult::Failed => {}
                        }
                    }
                }
            }
        }
        self.stats.lookups_in_flight = self.looking_up.len() as u64;
        self.stats.fetches_in_flight = self.fetching.len() as u64;
        self.stats.writes_queued = self.writing.len() as u64;
        fetched
    }

    /// A block that did not come back is not asked about again before `until`.
    fn forget(&mut self, digest: &PrefixDigest, until: u64) {
        self.present.remove(digest);
        self.absent.insert(*digest, until);
    }
}
