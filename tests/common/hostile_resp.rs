//! A hostile RESP server for `tests/remote_hostile.rs`: bound to 127.0.0.1 only, it answers
//! the connection setup (AUTH, SELECT, PING, and CLUSTER SLOTS as a one-node cluster) well and
//! the data commands (EXISTS, GET, SET) in the mode the test sets: well (a small in-memory
//! store), or with a huge bulk length then an endless stream of bytes, an endless length line,
//! a bulk string that never ends, a valid reply one byte at a time, silence, a malformed EXISTS
//! integer, an endless simple string, or half a reply then a close. Bounded: each connection
//! sends at most `MAX_SEND` bytes and lives at most `CONN_LIFETIME`; the server stops
//! accepting after `SERVER_LIFETIME` or when dropped.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most bytes one connection sends (a huge reply stops there, or when the client hangs up).
pub const MAX_SEND: u64 = 1 << 30;
pub const CONN_LIFETIME: Duration = Duration::from_secs(20);
pub const SERVER_LIFETIME: Duration = Duration::from_secs(120);

/// How the server answers EXISTS, GET and SET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Good,
    /// `$2147483648` then bytes until `MAX_SEND`.
    HugeBulk,
    /// `$` then digits forever.
    EndlessLength,
    /// A bulk string of the given length whose bytes go on past it, forever.
    EndlessBulk(usize),
    /// The good reply, one byte every `ms` milliseconds.
    ByteByByte(u64),
    /// Reads the commands, never answers.
    Silent,
    /// Answers EXISTS with these bytes (GET and SET well).
    BadExists(&'static [u8]),
    /// `+` then `A` forever.
    EndlessSimple,
    /// Half the good reply (a bulk length and part of its bytes), then closes.
    CloseMidReply,
}

struct State {
    port: u16,
    mode: Mutex<Mode>,
    data: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    stop: AtomicBool,
    /// Data commands received, and bytes sent (all connections).
    commands: AtomicU64,
    sent: AtomicU64,
}

pub struct HostileServer {
    pub port: u16,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl HostileServer {
    pub fn start(mode: Mode) -> HostileServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State {
            port,
            mode: Mutex::new(mode),
            data: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            commands: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        });
        let st = state.clone();
        let accept = std::thread::spawn(move || {
            let born = Instant::now();
            let mut conns = Vec::new();
            while !st.stop.load(Ordering::Relaxed) && born.elapsed() < SERVER_LIFETIME {
                match listener.accept() {
                    Ok((s, _)) => {
                        let st = st.clone();
                        conns.push(std::thread::spawn(move || serve(s, &st)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        });
        HostileServer {
            port,
            state,
            accept: Some(accept),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn set_mode(&self, m: Mode) {
        *self.state.mode.lock().unwrap() = m;
    }

    /// Data commands received so far.
    pub fn commands(&self) -> u64 {
        self.state.commands.load(Ordering::Relaxed)
    }

    /// Bytes sent so far.
    pub fn sent(&self) -> u64 {
        self.state.sent.load(Ordering::Relaxed)
    }

    /// Puts a value in the in-memory store (what `Good` serves).
    pub fn insert(&self, k: &[u8], v: &[u8]) {
        self.state
            .data
            .lock()
            .unwrap()
            .insert(k.to_vec(), v.to_vec());
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Reads one command (an array of bulk strings); `None` when the client left or time is up.
fn command(r: &mut BufReader<TcpStream>, st: &State, born: Instant) -> Option<Vec<Vec<u8>>> {
    let mut line = Vec::new();
    let read_line = |r: &mut BufReader<TcpStream>, line: &mut Vec<u8>| loop {
        if st.stop.load(Ordering::Relaxed) || born.elapsed() > CONN_LIFETIME {
            return false;
        }
        match r.read_until(b'\n', line) {
            Ok(0) => return false,
            Ok(_) if line.ends_with(b"\n") => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return false,
        }
    };
    if !read_line(r, &mut line) {
        return None;
    }
    let n: usize = std::str::from_utf8(&line[1..line.len() - 2])
        .ok()?
        .parse()
        .ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        if !read_line(r, &mut line) {
            return None;
        }
        let len: usize = std::str::from_utf8(&line[1..line.len() - 2])
            .ok()?
            .parse()
            .ok()?;
        let mut a = vec![0u8; len + 2];
        let mut got = 0;
        while got < a.len() {
            if st.stop.load(Ordering::Relaxed) || born.elapsed() > CONN_LIFETIME {
                return None;
            }
            match r.read(&mut a[got..]) {
                Ok(0) => return None,
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return None,
            }
        }
        a.truncate(len);
        args.push(a);
    }
    Some(args)
}

fn bulk(v: Option<&Vec<u8>>) -> Vec<u8> {
    match v {
        None => b"$-1\r\n".to_vec(),
        Some(v) => {
            let mut out = format!("${}\r\n", v.len()).into_bytes();
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
            out
        }
    }
}

/// The good reply to a data command.
fn good(args: &[Vec<u8>], st: &State) -> Vec<u8> {
    let mut data = st.data.lock().unwrap();
    match (args[0].to_ascii_uppercase().as_slice(), args.len()) {
        (b"GET", 2) => bulk(data.get(&args[1])),
        (b"EXISTS", 2) => format!(":{}\r\n", data.contains_key(&args[1]) as u8).into_bytes(),
        (b"SET", 3) => {
            data.insert(args[1].clone(), args[2].clone());
            b"+OK\r\n".to_vec()
        }
        _ => b"-ERR unknown command\r\n".to_vec(),
    }
}

/// Sends `chunk` again and again until the budget, the lifetime or the client ends it.
fn flood(w: &mut TcpStream, chunk: &[u8], st: &State, born: Instant, sent: &mut u64) {
    while *sent < MAX_SEND && born.elapsed() < CONN_LIFETIME && !st.stop.load(Ordering::Relaxed) {
        match w.write(chunk) {
            Ok(n) => {
                *sent += n as u64;
                st.sent.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return,
        }
    }
}

fn serve(s: TcpStream, st: &State) {
    let born = Instant::now();
    let _ = s.set_read_timeout(Some(Duration::from_millis(20)));
    let _ = s.set_write_timeout(Some(Duration::from_millis(20)));
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut sent = 0u64;
    let send = |w: &mut TcpStream, b: &[u8], sent: &mut u64| {
        let ok = w.write_all(b).is_ok();
        *sent += b.len() as u64;
        st.sent.fetch_add(b.len() as u64, Ordering::Relaxed);
        ok
    };
    while let Some(args) = command(&mut r, st, born) {
        if args.is_empty() {
            return;
        }
        let name = args[0].to_ascii_uppercase();
        if matches!(name.as_slice(), b"AUTH" | b"SELECT" | b"PING" | b"CLUSTER") {
            let reply = match name.as_slice() {
                b"PING" => b"+PONG\r\n".to_vec(),
                // A one-node cluster: every slot here.
                b"CLUSTER" => format!(
                    "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:{}\r\n",
                    st.port
                )
                .into_bytes(),
                _ => b"+OK\r\n".to_vec(),
            };
            if !send(&mut w, &reply, &mut sent) {
                return;
            }
            continue;
        }
        st.commands.fetch_add(1, Ordering::Relaxed);
        let mode = *st.mode.lock().unwrap();
        match mode {
            Mode::Good => {
                if !send(&mut w, &good(&args, st), &mut sent) {
                    return;
                }
            }
            Mode::HugeBulk => {
                send(&mut w, b"$2147483648\r\n", &mut sent);
                return flood(&mut w, &[b'x'; 64 << 10], st, born, &mut sent);
            }
            Mode::EndlessLength => {
                send(&mut w, b"$", &mut sent);
                return flood(&mut w, &[b'9'; 4096], st, born, &mut sent);
            }
            Mode::EndlessBulk(n) => {
                send(&mut w, format!("${n}\r\n").as_bytes(), &mut sent);
                return flood(&mut w, &[b'y'; 64 << 10], st, born, &mut sent);
            }
            Mode::ByteByByte(ms) => {
                for b in good(&args, st) {
                    if born.elapsed() > CONN_LIFETIME || !send(&mut w, &[b], &mut sent) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(ms));
                }
            }
            Mode::Silent => {}
            Mode::BadExists(reply) => {
                let reply = if name == b"EXISTS" {
                    reply.to_vec()
                } else {
                    good(&args, st)
                };
                if !send(&mut w, &reply, &mut sent) {
                    return;
                }
            }
            Mode::EndlessSimple => {
                send(&mut w, b"+", &mut sent);
                return flood(&mut w, &[b'A'; 4096], st, born, &mut sent);
            }
            Mode::CloseMidReply => {
                let full = match good(&args, st) {
                    f if f.len() > 8 => f,
                    _ => b"$64\r\n0123456789".to_vec(),
                };
                send(&mut w, &full[..full.len() / 2], &mut sent);
                return;
            }
        }
    }
}
