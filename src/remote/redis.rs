//! The Redis / Valkey backend of the remote tier's store, standalone or a Redis Cluster, on
//! the tier's worker threads, through kvblock's own bounded connections (`conn`, `resp`; a
//! cluster's routing in `cluster`). Why not the `redis` crate's clients (it parses the URLs
//! here): they read a bulk reply of whatever length the server announces, and their timeouts
//! bound one socket read, not a batch, so a broken or hostile server could make them buffer
//! gigabytes or wait forever. Here every batch ends by its deadline, whatever the server
//! sends: connecting by `connect_timeout`, each pipeline (every command written, every reply
//! read) by `io_timeout` (on a cluster the whole batch, every node and a map refresh, by
//! `connect_timeout + io_timeout`); a GET reply longer than the value the caller can accept is
//! refused at its first bytes. A failed connection is dropped, with the idle ones (they lead to
//! the same server), and reopened on a later batch; while the server (or a cluster node) is
//! unreachable, its batches fail at once (`Unavailable`) until a backoff that doubles from
//! `backoff_min` up to `backoff_max` has passed, so a dead server costs misses, not waits.
//! Lookups and writes are pipelined: one round trip per batch, in a cluster one per node the
//! keys hash to, a node down costing its keys only.
//!
//! TLS (`rediss://` URLs) needs the cargo feature `tls` (rustls with the ring provider,
//! `tls`): the server's certificate is checked against the configured authority (or the
//! system's trust store), and a client certificate is presented when one is configured.
//! Without the feature, `rediss://` is an error at creation that says so.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, IntoConnectionInfo};

use super::cluster::Cluster;
use super::conn::{Batch, Conn as Bounded, Endpoint};
use super::store::{ConnectionStats, RemoteStore, StoreError, StoreResult};
use crate::tier::io::lock;

/// How to reach the store.
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// `redis://host:port` URLs: one for a standalone server; the seed nodes of a cluster
    /// (any one is enough). A user and password in the URL are used unless set below.
    pub urls: Vec<String>,
    /// Speak the Redis Cluster protocol (slots routed per key).
    pub cluster: bool,
    /// ACL user (`None`: the URL's, else the default user).
    pub username: Option<String>,
    /// Password (`None`: the URL's, else none).
    pub password: Option<String>,
    pub connect_timeout: Duration,
    /// Deadline of one batch on a standalone server: writing its pipeline and reading every
    /// reply, whatever the server sends (on a cluster: of one reply).
    pub io_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Connections kept open (each worker thread uses one at a time).
    pub max_idle_connections: usize,
    /// `rediss://` only: PEM file of the certificate authorities the server's certificate must
    /// chain to (`None`: the system's trust store).
    pub tls_ca_file: Option<PathBuf>,
    /// `rediss://` only: PEM files of the client certificate and its private key, for servers
    /// that authenticate clients (`tls-auth-clients yes`); both or neither.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            urls: Vec::new(),
            cluster: false,
            username: None,
            password: None,
            connect_timeout: Duration::from_millis(500),
            io_timeout: Duration::from_millis(2000),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_millis(5000),
            max_idle_connections: 4,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

/// Checks the URL schemes against the TLS settings; returns whether TLS is used.
fn check_tls_settings(cfg: &RedisConfig) -> StoreResult<bool> {
    let tls = cfg.urls.iter().any(|u| u.starts_with("rediss://"));
    let scheme = if tls { "rediss://" } else { "redis://" };
    if let Some(u) = cfg.urls.iter().find(|u| !u.starts_with(scheme)) {
        let found = u.split("://").next().unwrap_or(u);
        return Err(StoreError::Other(format!(
            "unsupported URL scheme {found:?}: redis://, or rediss:// (TLS) for every URL"
        )));
    }
    if tls && !cfg!(feature = "tls") {
        return Err(StoreError::Other(
            "rediss:// (TLS) needs kvblock built with the cargo feature `tls` (CMake: \
             -DKVBLOCK_TLS=ON); this build has no TLS"
                .into(),
        ));
    }
    let files = [&cfg.tls_ca_file, &cfg.tls_cert_file, &cfg.tls_key_file];
    if !tls && files.iter().any(|f| f.is_some()) {
        return Err(StoreError::Other(
            "TLS files are set but the URLs are redis://: use rediss://".into(),
        ));
    }
    if cfg.tls_cert_file.is_some() != cfg.tls_key_file.is_some() {
        return Err(StoreError::Other(
            "tls_cert_file and tls_key_file go together (a client certificate and its key)".into(),
        ));
    }
    Ok(tls)
}

/// A connection's address and settings from a URL (credentials set in the config win).
fn endpoint(url: &str, cfg: &RedisConfig, tls: bool) -> StoreResult<Endpoint> {
    let info = url
        .into_connection_info()
        .map_err(|e| StoreError::Other(format!("bad Redis URL: {e}")))?;
    let (host, port) = match info.addr() {
        ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            ..
        } => (host.clone(), *port),
        other => {
            return Err(StoreError::Other(format!(
                "unsupported Redis address {other} (redis://host:port, rediss://host:port)"
            )))
        }
    };
    let r = info.redis_settings();
    #[cfg(feature = "tls")]
    let tls = if tls {
        Some(super::tls::client_config(
            cfg.tls_ca_file.as_deref(),
            cfg.tls_cert_file.as_deref(),
            cfg.tls_key_file.as_deref(),
        )?)
    } else {
        None
    };
    #[cfg(not(feature = "tls"))]
    let _ = tls; // always false here: check_tls_settings refused rediss://
    Ok(Endpoint {
        host,
        port,
        username: cfg
            .username
            .clone()
            .or_else(|| r.username().map(String::from)),
        password: cfg
            .password
            .clone()
            .or_else(|| r.password().map(String::from)),
        db: r.db(),
        #[cfg(feature = "tls")]
        tls,
    })
}

enum Client {
    Single(Endpoint),
    Cluster(Box<Cluster>),
}

/// The reconnection backoff of a server (or of one cluster node).
#[derive(Default)]
pub(super) struct Backoff {
    failures: u32,
    pub(super) retry_at: Option<Instant>,
}

impl Backoff {
    /// Starts (or lengthens) the backoff after a failure: `min` doubling up to `max`.
    pub(super) fn failed(&mut self, min: Duration, max: Duration) {
        let shift = self.failures.min(16);
        let wait = min.saturating_mul(1u32 << shift).min(max);
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(Instant::now() + wait);
    }
}

/// Connection counters (`ConnectionStats`), shared with the cluster's routing.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) connects: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    pub(super) backoff_refusals: AtomicU64,
    pub(super) drops: AtomicU64,
    pub(super) reply_bytes: AtomicU64,
}

/// A Redis or Redis Cluster store.
pub struct RedisStore {
    cfg: RedisConfig,
    client: Client,
    idle: Mutex<Vec<Bounded>>,
    backoff: Mutex<Backoff>,
    counters: Counters,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisStore({})", self.describe())
    }
}

impl RedisStore {
    /// Builds the client and makes one bounded attempt to connect and authenticate (on a
    /// cluster: to read its slot map). Credentials the server refuses (and malformed URLs,
    /// `rediss://` without TLS, a cluster URL that is not a cluster) are an error here; a
    /// server that cannot be reached is not: the store starts backing off and its batches are
    /// misses until it answers.
    pub fn connect(cfg: RedisConfig) -> StoreResult<RedisStore> {
        if cfg.urls.is_empty() {
            return Err(StoreError::Other("no Redis URL given".into()));
        }
        let tls = check_tls_settings(&cfg)?;
        if cfg.io_timeout.is_zero() || cfg.connect_timeout.is_zero() {
            return Err(StoreError::Other("Redis timeouts must be positive".into()));
        }
        let mut eps = Vec::with_capacity(cfg.urls.len());
        for u in &cfg.urls {
            eps.push(endpoint(u, &cfg, tls)?);
        }
        let client = if cfg.cluster {
            let seeds = eps.iter().map(|e| (e.host.clone(), e.port)).collect();
            Client::Cluster(Box::new(Cluster::new(
                eps.swap_remove(0),
                seeds,
                cfg.clone(),
            )))
        } else if eps.len() != 1 {
            return Err(StoreError::Other(
                "a standalone Redis takes one URL (several: set cluster)".into(),
            ));
        } else {
            Client::Single(eps.pop().expect("one"))
        };
        let store = RedisStore {
            cfg,
            client,
            idle: Mutex::new(Vec::new()),
            backoff: Mutex::new(Backoff::default()),
            counters: Counters::default(),
        };
        match &store.client {
            Client::Single(_) => match store.open() {
                // It answered PING when it opened.
                Ok(c) => lock(&store.idle).push(c),
                Err(StoreError::Auth(m)) => return Err(StoreError::Auth(m)),
                Err(_) => {}
            },
            Client::Cluster(c) => match c.refresh(&c.deadline(), &store.counters) {
                Ok(()) => {}
                // Refused credentials; or seeds that answer but refuse the slot map (not a
                // cluster).
                Err(e @ (StoreError::Auth(_) | StoreError::Other(_))) => return Err(e),
                Err(_) => {}
            },
        }
        Ok(store)
    }

    fn open(&self) -> StoreResult<Bounded> {
        let Client::Single(ep) = &self.client else {
            unreachable!("a cluster opens its connections itself")
        };
        match Bounded::open(ep, self.cfg.connect_timeout) {
            Ok(c) => {
                self.counters.connects.fetch_add(1, Ordering::Relaxed);
                Ok(c)
            }
            Err(e) => {
                self.counters
                    .connect_failures
                    .fetch_add(1, Ordering::Relaxed);
                self.failed();
                Err(e)
            }
        }
    }

    /// Starts (or lengthens) the backoff after a failure.
    fn failed(&self) {
        lock(&self.backoff).failed(self.cfg.backoff_min, self.cfg.backoff_max);
    }

    /// A connection to use (an idle one, or a new one unless backing off).
    fn checkout(&self) -> StoreResult<Bounded> {
        if let Some(c) = lock(&self.idle).pop() {
            return Ok(c);
        }
        if let Some(at) = lock(&self.backoff).retry_at {
            if Instant::now() < at {
                self.counters
                    .backoff_refusals
                    .fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Unavailable(format!(
                    "{} unreachable; retrying after a backoff",
                    self.describe()
                )));
            }
        }
        self.open()
    }

    fn checkin(&self, c: Bounded) {
        *lock(&self.backoff) = Backoff::default();
        let mut idle = lock(&self.idle);
        if idle.len() < self.cfg.max_idle_connections {
            idle.push(c);
        }
    }

    /// Runs one batch: on a standalone server `op` on all the keys (`n`) over one connection;
    /// on a cluster `op` on each node's keys. A connection that failed is dropped with the
    /// idle ones (they lead to the same server), and the backoff starts.
    fn run<T: Clone>(
        &self,
        keys: &[&[u8]],
        op: impl Fn(&mut Bounded, &[usize], Duration) -> Batch<T>,
    ) -> Vec<StoreResult<T>> {
        if keys.is_empty() {
            return Vec::new();
        }
        if let Client::Cluster(c) = &self.client {
            return c.run(keys, &self.counters, op);
        }
        let mut conn = match self.checkout() {
            Ok(c) => c,
            Err(e) => return vec![Err(e); keys.len()],
        };
        let all: Vec<usize> = (0..keys.len()).collect();
        let before = conn.bytes_read();
        let (out, broke) = op(&mut conn, &all, self.cfg.io_timeout);
        self.counters
            .reply_bytes
            .fetch_add(conn.bytes_read() - before, Ordering::Relaxed);
        if broke.is_none() {
            self.checkin(conn);
        } else {
            drop(conn);
            let idle = std::mem::take(&mut *lock(&self.idle));
            self.counters
                .drops
                .fetch_add(1 + idle.len() as u64, Ordering::Relaxed);
            self.failed();
        }
        out
    }
}

fn pick<'a, T: ?Sized>(all: &[&'a T], idxs: &[usize]) -> Vec<&'a T> {
    idxs.iter().map(|&i| all[i]).collect()
}

impl RemoteStore for RedisStore {
    fn exists(&self, keys: &[&[u8]]) -> Vec<StoreResult<bool>> {
        self.run(keys, |c, idxs, t| c.exists(&pick(keys, idxs), t))
    }

    fn get(&self, keys: &[&[u8]], max_len: usize) -> Vec<StoreResult<Option<Vec<u8>>>> {
        self.run(keys, |c, idxs, t| c.get(&pick(keys, idxs), max_len, t))
    }

    fn put(&self, items: &[(&[u8], &[u8])]) -> Vec<StoreResult<()>> {
        let keys: Vec<&[u8]> = items.iter().map(|i| i.0).collect();
        self.run(&keys, |c, idxs, t| {
            let batch: Vec<(&[u8], &[u8])> = idxs.iter().map(|&i| items[i]).collect();
            c.set(&batch, t)
        })
    }

    fn connection_stats(&self) -> ConnectionStats {
        let c = &self.counters;
        ConnectionStats {
            connects: c.connects.load(Ordering::Relaxed),
            connect_failures: c.connect_failures.load(Ordering::Relaxed),
            backoff_refusals: c.backoff_refusals.load(Ordering::Relaxed),
            drops: c.drops.load(Ordering::Relaxed),
            reply_bytes: c.reply_bytes.load(Ordering::Relaxed),
        }
    }

    fn describe(&self) -> String {
        let hosts: Vec<String> = self
            .cfg
            .urls
            .iter()
            .map(|u| {
                // No credentials in messages.
                let rest = u.split_once("://").map_or(u.as_str(), |(_, r)| r);
                let host = rest.rsplit('@').next().unwrap_or(rest);
                host.split('/').next().unwrap_or(host).to_string()
            })
            .collect();
        format!(
            "{} {}",
            if self.cfg.cluster {
                "Redis Cluster"
            } else {
                "Redis"
            },
            hosts.join(",")
        )
    }
}
