//! The Redis / Valkey backend of the remote tier's store, standalone or a Redis Cluster, on
//! the tier's worker threads. A standalone server is spoken to through kvblock's own bounded
//! connections (`conn`, `resp`: the `redis` crate cannot bound a bulk reply nor a whole reply's
//! time); a cluster through the `redis` crate's synchronous cluster client. Waits are bounded:
//! connecting by `connect_timeout`; on a standalone server each batch (one pipeline, every
//! reply) by `io_timeout` whatever the server sends, and a GET reply longer than the value the
//! caller can accept is refused at its first bytes; on a cluster each reply by `io_timeout`
//! (the crate's). A failed connection is dropped, with the idle ones (they lead to the same
//! server), and reopened on a later batch; while the server is unreachable, batches fail at
//! once (`Unavailable`) until a backoff that doubles from `backoff_min` up to `backoff_max` has
//! passed, so a dead server costs misses, not waits. Lookups and writes are pipelined (one
//! round trip per batch; in a cluster, one per node the keys hash to); when a cluster pipeline
//! fails (a node down), its keys are retried one by one so each gets its own result.
//!
//! TLS (`rediss://` URLs) needs the cargo feature `tls` (rustls with the ring provider): the
//! server's certificate is checked against the configured authority (or the system's trust
//! store), and a client certificate is presented when one is configured. Without the feature,
//! `rediss://` is an error at creation that says so.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError, RedisResult};

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

/// The certificates of a `rediss://` store, read from the configured files.
#[cfg(feature = "tls")]
fn tls_certificates(cfg: &RedisConfig) -> StoreResult<redis::TlsCertificates> {
    // rustls needs a process-wide crypto provider; keep the engine's if it installed one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |p: &PathBuf, what: &str| {
        std::fs::read(p).map_err(|e| StoreError::Other(format!("{what} {}: {e}", p.display())))
    };
    let client_tls = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (Some(c), Some(k)) => Some(redis::ClientTlsConfig {
            client_cert: read(c, "tls_cert_file")?,
            client_key: read(k, "tls_key_file")?,
        }),
        _ => None,
    };
    let root_cert = match &cfg.tls_ca_file {
        Some(p) => Some(read(p, "tls_ca_file")?),
        None => None,
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

enum Client {
    Single(Endpoint),
    Cluster(Box<ClusterClient>),
}

enum Conn {
    Single(Box<Bounded>),
    Cluster(Box<ClusterConnection>),
}

#[derive(Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
}

/// A Redis or Redis Cluster store.
pub struct RedisStore {
    cfg: RedisConfig,
    client: Client,
    idle: Mutex<Vec<Conn>>,
    backoff: Mutex<Backoff>,
    connects: AtomicU64,
    connect_failures: AtomicU64,
    backoff_refusals: AtomicU64,
    drops: AtomicU64,
    reply_bytes: AtomicU64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisStore({})", self.describe())
    }
}

/// Maps a client error to the store's error kinds.
fn classify(e: &RedisError) -> StoreError {
    let text = e.to_string();
    let upper = text.to_ascii_uppercase();
    // A refused certificate (theirs or ours) is a configuration error, not an outage.
    if ["CERTIFICATE", "HANDSHAKE", "TLS ALERT"]
        .iter()
        .any(|w| upper.contains(w))
    {
        return StoreError::Auth(format!("TLS: {text}"));
    }
    let auth = e.kind() == ErrorKind::AuthenticationFailed
        || ["WRONGPASS", "NOAUTH", "NOPERM", "INVALID PASSWORD"]
            .iter()
            .any(|w| upper.contains(w));
    if auth {
        StoreError::Auth(text)
    } else if e.is_timeout() {
        StoreError::Timeout(text)
    } else if e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped() {
        StoreError::Unavailable(text)
    } else {
        StoreError::Other(text)
    }
}

fn cluster_pipe_keys(cmd: &str, keys: &[&[u8]]) -> redis::cluster::ClusterPipeline {
    let mut p = redis::cluster::cluster_pipe();
    for k in keys {
        p.cmd(cmd).arg(*k);
    }
    p
}

impl RedisStore {
    /// Builds the client and makes one bounded attempt to connect and authenticate. Credentials
    /// the server refuses (and malformed URLs, `rediss://`) are an error here; a server that
    /// cannot be reached is not: the store starts backing off and its batches are misses until
    /// it answers.
    pub fn connect(cfg: RedisConfig) -> StoreResult<RedisStore> {
        if cfg.urls.is_empty() {
            return Err(StoreError::Other("no Redis URL given".into()));
        }
        let tls = check_tls_settings(&cfg)?;
        if cfg.io_timeout.is_zero() || cfg.connect_timeout.is_zero() {
            return Err(StoreError::Other("Redis timeouts must be positive".into()));
        }
        let mut infos = Vec::with_capacity(cfg.urls.len());
        for u in &cfg.urls {
            let mut info = u
                .as_str()
                .into_connection_info()
                .map_err(|e| StoreError::Other(format!("bad Redis URL: {e}")))?;
            let mut settings = info.redis_settings().clone();
            if let Some(p) = &cfg.password {
                settings = settings.set_password(p);
            }
            if let Some(n) = &cfg.username {
                settings = settings.set_username(n);
            }
            info = info.set_redis_settings(settings);
            infos.push(info);
        }
        let client = if cfg.cluster {
            let mut b = ClusterClient::builder(infos)
                .connection_timeout(cfg.connect_timeout)
                .response_timeout(cfg.io_timeout)
                .retries(1)
                .min_retry_wait(10)
                .max_retry_wait(50);
            if let Some(p) = &cfg.password {
                b = b.password(p);
            }
            if let Some(n) = &cfg.username {
                b = b.username(n);
            }
            #[cfg(feature = "tls")]
            if tls {
                b = b.certs(tls_certificates(&cfg)?);
            }
            Client::Cluster(Box::new(b.build().map_err(|e| classify(&e))?))
        } else {
            if infos.len() != 1 {
                return Err(StoreError::Other(
                    "a standalone Redis takes one URL (several: set cluster)".into(),
                ));
            }
            let info = infos.pop().expect("one");
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
            Client::Single(Endpoint {
                host,
                port,
                username: r.username().map(String::from),
                password: r.password().map(String::from),
                db: r.db(),
                #[cfg(feature = "tls")]
                tls,
            })
        };
        let store = RedisStore {
            cfg,
            client,
            idle: Mutex::new(Vec::new()),
            backoff: Mutex::new(Backoff::default()),
            connects: AtomicU64::new(0),
            connect_failures: AtomicU64::new(0),
            backoff_refusals: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            reply_bytes: AtomicU64::new(0),
        };
        match store.open() {
            // A standalone connection answered PING when it opened.
            Ok(c @ Conn::Single(_)) => lock(&store.idle).push(c),
            Ok(Conn::Cluster(mut c)) => match redis::cmd("PING").query::<String>(&mut *c) {
                Ok(_) => lock(&store.idle).push(Conn::Cluster(c)),
                Err(e) => match classify(&e) {
                    StoreError::Auth(m) => return Err(StoreError::Auth(m)),
                    _ => store.failed(),
                },
            },
            Err(StoreError::Auth(m)) => return Err(StoreError::Auth(m)),
            Err(StoreError::Other(m)) if store.cfg.cluster => {
                // A cluster whose seeds answer but refuse the topology request (not a cluster).
                return Err(StoreError::Other(m));
            }
            Err(_) => {}
        }
        Ok(store)
    }

    fn open(&self) -> StoreResult<Conn> {
        let r = match &self.client {
            Client::Single(ep) => {
                Bounded::open(ep, self.cfg.connect_timeout).map(|c| Conn::Single(Box::new(c)))
            }
            Client::Cluster(c) => c
                .get_connection()
                .map(|c| Conn::Cluster(Box::new(c)))
                .map_err(|e| classify(&e)),
        };
        match r {
            Ok(c) => {
                self.connects.fetch_add(1, Ordering::Relaxed);
                Ok(c)
            }
            Err(e) => {
                self.connect_failures.fetch_add(1, Ordering::Relaxed);
                self.failed();
                Err(e)
            }
        }
    }

    /// Starts (or lengthens) the backoff after a failure.
    fn failed(&self) {
        let mut b = lock(&self.backoff);
        let shift = b.failures.min(16);
        let wait = self
            .cfg
            .backoff_min
            .saturating_mul(1u32 << shift)
            .min(self.cfg.backoff_max);
        b.failures = b.failures.saturating_add(1);
        b.retry_at = Some(Instant::now() + wait);
    }

    fn succeeded(&self) {
        let mut b = lock(&self.backoff);
        b.failures = 0;
        b.retry_at = None;
    }

    /// A connection to use (an idle one, or a new one unless backing off).
    fn checkout(&self) -> StoreResult<Conn> {
        if let Some(c) = lock(&self.idle).pop() {
            return Ok(c);
        }
        if let Some(at) = lock(&self.backoff).retry_at {
            if Instant::now() < at {
                self.backoff_refusals.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Unavailable(format!(
                    "{} unreachable; retrying after a backoff",
                    self.describe()
                )));
            }
        }
        self.open()
    }

    fn checkin(&self, c: Conn) {
        self.succeeded();
        let mut idle = lock(&self.idle);
        if idle.len() < self.cfg.max_idle_connections {
            idle.push(c);
        }
    }

    /// Runs one batch on a connection: `single` on a standalone server (its results, and the
    /// error that broke the connection if one did), `cluster` on a cluster (it gives per-key
    /// results itself). A connection that failed is dropped with the idle ones, and the
    /// backoff starts.
    fn run<T: Clone>(
        &self,
        n: usize,
        single: impl FnOnce(&mut Bounded) -> Batch<T>,
        cluster: impl FnOnce(&mut ClusterConnection) -> (Vec<StoreResult<T>>, bool),
    ) -> Vec<StoreResult<T>> {
        let mut conn = match self.checkout() {
            Ok(c) => c,
            Err(e) => return vec![Err(e); n],
        };
        let (out, healthy) = match &mut conn {
            Conn::Single(c) => {
                let before = c.bytes_read();
                let (out, broke) = single(c);
                self.reply_bytes
                    .fetch_add(c.bytes_read() - before, Ordering::Relaxed);
                (out, broke.is_none())
            }
            Conn::Cluster(c) => cluster(c),
        };
        if healthy {
            self.checkin(conn);
        } else {
            drop(conn);
            let idle = std::mem::take(&mut *lock(&self.idle));
            self.drops
                .fetch_add(1 + idle.len() as u64, Ordering::Relaxed);
            self.failed();
        }
        out
    }

    /// A cluster batch: the pipeline, or (when it fails) each key on its own. Healthy when
    /// at least one key was answered.
    fn cluster_batch<T>(
        con: &mut ClusterConnection,
        n: usize,
        pipeline: impl FnOnce(&mut ClusterConnection) -> RedisResult<Vec<T>>,
        one: impl Fn(&mut ClusterConnection, usize) -> RedisResult<T>,
    ) -> (Vec<StoreResult<T>>, bool) {
        match pipeline(con) {
            Ok(v) if v.len() == n => (v.into_iter().map(Ok).collect(), true),
            _ => {
                let out: Vec<StoreResult<T>> = (0..n)
                    .map(|i| one(con, i).map_err(|e| classify(&e)))
                    .collect();
                let healthy = out.iter().any(Result::is_ok);
                (out, healthy)
            }
        }
    }
}

impl RemoteStore for RedisStore {
    fn exists(&self, keys: &[&[u8]]) -> Vec<StoreResult<bool>> {
        if keys.is_empty() {
            return Vec::new();
        }
        self.run(
            keys.len(),
            |c| c.exists(keys, self.cfg.io_timeout),
            |c| {
                Self::cluster_batch(
                    c,
                    keys.len(),
                    |c| cluster_pipe_keys("EXISTS", keys).query::<Vec<bool>>(c),
                    |c, i| redis::cmd("EXISTS").arg(keys[i]).query::<bool>(c),
                )
            },
        )
    }

    fn get(&self, keys: &[&[u8]], max_len: usize) -> Vec<StoreResult<Option<Vec<u8>>>> {
        if keys.is_empty() {
            return Vec::new();
        }
        let mut out = self.run(
            keys.len(),
            |c| c.get(keys, max_len, self.cfg.io_timeout),
            |c| {
                Self::cluster_batch(
                    c,
                    keys.len(),
                    |c| cluster_pipe_keys("GET", keys).query::<Vec<Option<Vec<u8>>>>(c),
                    |c, i| redis::cmd("GET").arg(keys[i]).query::<Option<Vec<u8>>>(c),
                )
            },
        );
        // The cluster client has buffered the value already: refused and counted all the same.
        for r in &mut out {
            if let Ok(Some(v)) = r {
                if v.len() > max_len {
                    let m = format!("a value of {} bytes, more than {max_len}", v.len());
                    *r = Err(StoreError::Oversized(m));
                }
            }
        }
        out
    }

    fn put(&self, items: &[(&[u8], &[u8])]) -> Vec<StoreResult<()>> {
        if items.is_empty() {
            return Vec::new();
        }
        let single = |c: &mut Bounded| c.set(items, self.cfg.io_timeout);
        self.run(items.len(), single, |c| {
            Self::cluster_batch(
                c,
                items.len(),
                |c| {
                    let mut p = redis::cluster::cluster_pipe();
                    for (k, v) in items {
                        p.cmd("SET").arg(*k).arg(*v).ignore();
                    }
                    p.query::<()>(c).map(|()| vec![(); items.len()])
                },
                |c, i| {
                    redis::cmd("SET")
                        .arg(items[i].0)
                        .arg(items[i].1)
                        .query::<()>(c)
                },
            )
        })
    }

    fn connection_stats(&self) -> ConnectionStats {
        ConnectionStats {
            connects: self.connects.load(Ordering::Relaxed),
            connect_failures: self.connect_failures.load(Ordering::Relaxed),
            backoff_refusals: self.backoff_refusals.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
            reply_bytes: self.reply_bytes.load(Ordering::Relaxed),
        }
    }

    fn describe(&self) -> String {
        let hosts: Vec<String> = self
            .cfg
            .urls
            .iter()
            .map(|u| {
                // No credentials in messages.
                let rest = u.trim_start_matches("redis://");
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
