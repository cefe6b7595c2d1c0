//! One bounded connection to a standalone Redis / Valkey server (plain TCP, or TLS with the
//! feature `tls`) and the three pipelines the remote tier runs on it: EXISTS, GET and SET.
//! Connecting (TCP, the TLS handshake, AUTH, SELECT) ends by `connect_timeout`; each pipeline,
//! writing every command and reading every reply, ends by one deadline (`io_timeout`), and a
//! GET reply longer than the caller's bound is refused at its length line (`resp`). A
//! pipeline that fails other than by a reply the server gave for a key leaves the connection
//! in an unknown state: `Failed` tells the caller to drop it.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::resp::{encode, Deadline, Reply, RespError, RespStream, Transport, Value};
use super::store::{StoreError, StoreResult};

/// Where and how to connect.
#[derive(Clone)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
    #[cfg(feature = "tls")]
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
}

/// The byte stream under a connection.
enum Stream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<super::tls::TlsStream>),
}

impl std::io::Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(b),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read(b),
        }
    }
}

impl std::io::Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(b),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.flush(),
        }
    }
}

impl Transport for Stream {
    fn set_timeouts(&mut self, t: Duration) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.set_timeouts(t),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.set_timeouts(t),
        }
    }
}

/// Each key's result, and the error that broke the connection if one did.
pub type Batch<T> = (Vec<StoreResult<T>>, Option<StoreError>);

/// A pipeline that broke the connection: the error of the reply (or write) that broke it.
#[derive(Debug)]
pub struct Failed(pub StoreError);

/// Maps a failed exchange to the store's error kinds.
pub fn store_error(e: RespError) -> StoreError {
    match e {
        RespError::Timeout => StoreError::Timeout(e.to_string()),
        RespError::Closed => StoreError::Unavailable(e.to_string()),
        RespError::Io(io) => {
            // A certificate refused (theirs or ours) is a configuration error, not an outage.
            let text = io.to_string();
            let upper = text.to_ascii_uppercase();
            if ["CERTIFICATE", "HANDSHAKE", "ALERT"]
                .iter()
                .any(|w| upper.contains(w))
            {
                StoreError::Auth(format!("TLS: {text}"))
            } else {
                StoreError::Unavailable(text)
            }
        }
        RespError::Protocol(_) => StoreError::Protocol(e.to_string()),
        RespError::Oversized { .. } => StoreError::Oversized(e.to_string()),
    }
}

/// An error reply to one command: credentials refused, or anything else.
fn reply_error(m: String) -> StoreError {
    let upper = m.to_ascii_uppercase();
    if ["WRONGPASS", "NOAUTH", "NOPERM", "INVALID PASSWORD"]
        .iter()
        .any(|w| upper.contains(w))
    {
        StoreError::Auth(m)
    } else {
        StoreError::Other(m)
    }
}

/// The longest bulk string read in reply to a command other than GET (none of them has one:
/// a short one is read and refused as a protocol error, a longer one as oversized).
const SMALL: usize = 64;

/// A connection to a standalone server.
pub struct Conn {
    s: RespStream<Stream>,
}

impl Conn {
    /// Connects and authenticates by `timeout`.
    pub fn open(ep: &Endpoint, timeout: Duration) -> StoreResult<Conn> {
        let dl = Deadline::after(timeout);
        let addrs = (ep.host.as_str(), ep.port)
            .to_socket_addrs()
            .map_err(|e| StoreError::Unavailable(format!("{}:{}: {e}", ep.host, ep.port)))?;
        let mut last = StoreError::Unavailable(format!("{}:{}: no address", ep.host, ep.port));
        let mut tcp = None;
        for a in addrs {
            let left = dl.remaining().map_err(store_error)?;
            match TcpStream::connect_timeout(&a, left) {
                Ok(t) => {
                    tcp = Some(t);
                    break;
                }
                Err(e) => last = StoreError::Unavailable(format!("{a}: {e}")),
            }
        }
        let tcp = tcp.ok_or(last)?;
        let _ = tcp.set_nodelay(true);
        #[cfg(feature = "tls")]
        let stream = match &ep.tls {
            Some(cfg) => Stream::Tls(Box::new(super::tls::wrap(cfg, &ep.host, tcp)?)),
            None => Stream::Plain(tcp),
        };
        #[cfg(not(feature = "tls"))]
        let stream = Stream::Plain(tcp);
        let mut c = Conn {
            s: RespStream::new(stream),
        };
        let mut setup: Vec<Vec<Vec<u8>>> = Vec::new();
        if let Some(p) = &ep.password {
            let mut auth = vec![b"AUTH".to_vec()];
            if let Some(u) = &ep.username {
                auth.push(u.as_bytes().to_vec());
            }
            auth.push(p.as_bytes().to_vec());
            setup.push(auth);
        }
        if ep.db != 0 {
            setup.push(vec![b"SELECT".to_vec(), ep.db.to_string().into_bytes()]);
        }
        // PING proves the server speaks (and, over TLS, that the handshake, which runs on the
        // first exchange, succeeded) before the connection is handed out.
        setup.push(vec![b"PING".to_vec()]);
        let mut out = Vec::new();
        for cmd in &setup {
            let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
            encode(&mut out, &args);
        }
        c.s.write_all(&out, &dl).map_err(store_error)?;
        for _ in &setup {
            match c.s.read_reply(SMALL, &dl).map_err(store_error)? {
                Reply::Simple(_) => {}
                Reply::Error(m) => return Err(reply_error(m)),
                r => return Err(StoreError::Protocol(format!("setup reply {r:?}"))),
            }
        }
        Ok(c)
    }

    /// The cluster's slot map (CLUSTER SLOTS, at most 1 MiB) by `timeout`; an error reply is
    /// that error (`Other`, or `Auth`).
    pub fn cluster_slots(&mut self, timeout: Duration) -> StoreResult<Value> {
        let dl = Deadline::after(timeout);
        let mut out = Vec::new();
        encode(&mut out, &[b"CLUSTER", b"SLOTS"]);
        self.s.write_all(&out, &dl).map_err(store_error)?;
        match self.s.read_value(1 << 20, &dl).map_err(store_error)? {
            Value::Reply(Reply::Error(m)) => Err(reply_error(m)),
            v => Ok(v),
        }
    }

    /// Bytes read from the server on this connection.
    pub fn bytes_read(&self) -> u64 {
        self.s.bytes_read
    }

    /// Sends one command per entry and reads one reply per entry by `timeout`; `check` turns
    /// each reply into a key's result (`Err(Failed)`: not a reply this command can have).
    /// Results of the replies read before a failure stand; the failing key and those after it
    /// get its error, and the connection must be dropped.
    fn pipeline<T: Clone>(
        &mut self,
        cmds: &[Vec<&[u8]>],
        max_bulk: usize,
        timeout: Duration,
        check: impl Fn(Reply) -> Result<StoreResult<T>, Failed>,
    ) -> Batch<T> {
        let dl = Deadline::after(timeout);
        let mut out = Vec::new();
        for c in cmds {
            encode(&mut out, c);
        }
        let mut res = Vec::with_capacity(cmds.len());
        let broke = match self.s.write_all(&out, &dl) {
            Err(e) => Some(store_error(e)),
            Ok(()) => {
                drop(out);
                let mut broke = None;
                for _ in cmds {
                    let r = self
                        .s
                        .read_reply(max_bulk, &dl)
                        .map_err(|e| Failed(store_error(e)))
                        .and_then(&check);
                    match r {
                        Ok(r) => res.push(r),
                        Err(Failed(e)) => {
                            broke = Some(e);
                            break;
                        }
                    }
                }
                broke
            }
        };
        if let Some(e) = &broke {
            res.resize(cmds.len(), Err(e.clone()));
        }
        (res, broke)
    }

    /// EXISTS of each key: each reply must be the integer 0 or 1.
    pub fn exists(&mut self, keys: &[&[u8]], timeout: Duration) -> Batch<bool> {
        let cmds: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"EXISTS"[..], k]).collect();
        self.pipeline(&cmds, SMALL, timeout, |r| match r {
            Reply::Int(0) => Ok(Ok(false)),
            Reply::Int(1) => Ok(Ok(true)),
            Reply::Error(m) => Ok(Err(reply_error(m))),
            r => Err(Failed(StoreError::Protocol(format!(
                "EXISTS of one key answered {r:?}, not 0 or 1"
            )))),
        })
    }

    /// GET of each key: a bulk string of at most `max_len` bytes, or nil.
    pub fn get(
        &mut self,
        keys: &[&[u8]],
        max_len: usize,
        timeout: Duration,
    ) -> Batch<Option<Vec<u8>>> {
        let cmds: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"GET"[..], k]).collect();
        self.pipeline(&cmds, max_len, timeout, |r| match r {
            Reply::Bulk(v) => Ok(Ok(Some(v))),
            Reply::Nil => Ok(Ok(None)),
            Reply::Error(m) => Ok(Err(reply_error(m))),
            r => Err(Failed(StoreError::Protocol(format!("GET answered {r:?}")))),
        })
    }

    /// SET of each item: each reply must be OK.
    pub fn set(&mut self, items: &[(&[u8], &[u8])], timeout: Duration) -> Batch<()> {
        let cmds: Vec<Vec<&[u8]>> = items.iter().map(|(k, v)| vec![&b"SET"[..], k, v]).collect();
        self.pipeline(&cmds, SMALL, timeout, |r| match r {
            Reply::Simple(s) if s == "OK" => Ok(Ok(())),
            Reply::Error(m) => Ok(Err(reply_error(m))),
            r => Err(Failed(StoreError::Protocol(format!("SET answered {r:?}")))),
        })
    }
}
