//! A bounded RESP2 codec for the remote tier's own commands on a standalone server (AUTH,
//! SELECT, PING, EXISTS, GET, SET). Why not the `redis` crate here: its parser reads a bulk
//! string of whatever length the server announces before handing it over, and its timeouts
//! bound one socket read, not a reply; a broken or hostile server could make it buffer
//! gigabytes, or hold a batch forever by sending one byte per timeout. This reader refuses a
//! bulk string longer than the caller's bound at its length line (before any of its bytes is
//! buffered), caps every other line, and re-arms the socket timeout from one deadline before
//! every read and write, so a whole exchange ends by that deadline whatever the server sends.
//!
//! Memory of one connection: its read buffer (`BUF_BYTES`) plus at most one bulk string of the
//! caller's bound being read (replies already read belong to the caller).

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Bytes of a connection's read buffer.
pub const BUF_BYTES: usize = 16 << 10;
/// Longest line accepted: a simple string, an error, an integer or a length (with its CRLF).
pub const MAX_LINE: usize = 4096;

/// When an exchange must be over.
#[derive(Clone, Copy, Debug)]
pub struct Deadline(pub Instant);

impl Deadline {
    pub fn after(d: Duration) -> Deadline {
        Deadline(Instant::now() + d)
    }

    /// The time left, or `Timeout` when none is.
    pub fn remaining(&self) -> Result<Duration, RespError> {
        let left = self.0.saturating_duration_since(Instant::now());
        // A zero socket timeout means "none" to the OS: below a millisecond is over.
        if left < Duration::from_millis(1) {
            Err(RespError::Timeout)
        } else {
            Ok(left)
        }
    }
}

/// Why an exchange failed. Every one of these leaves the connection in an unknown state: the
/// caller drops it.
#[derive(Debug)]
pub enum RespError {
    /// The deadline passed.
    Timeout,
    /// The server closed the connection (mid-reply or before it).
    Closed,
    /// A transport error (the OS's, or TLS's).
    Io(io::Error),
    /// Not a reply this command can have: a malformed line, length or integer, a line longer
    /// than `MAX_LINE`, a reply of the wrong type, a missing CRLF.
    Protocol(String),
    /// A bulk string longer than the bound (the most a value of ours can be).
    Oversized { declared: u64, bound: usize },
}

impl std::fmt::Display for RespError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RespError::Timeout => write!(f, "no complete reply before the deadline"),
            RespError::Closed => write!(f, "the server closed the connection"),
            RespError::Io(e) => write!(f, "{e}"),
            RespError::Protocol(m) => write!(f, "malformed reply: {m}"),
            RespError::Oversized { declared, bound } => write!(
                f,
                "a reply of {declared} bytes, more than the {bound} bytes a value can have"
            ),
        }
    }
}

/// One reply (RESP2, no arrays: only CLUSTER SLOTS has one, read by `read_value`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    /// An error the server reported for this command (the connection stays usable).
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
}

/// A reply that may be an array (CLUSTER SLOTS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Reply(Reply),
    Array(Vec<Value>),
}

/// Deepest array nesting `read_value` accepts (CLUSTER SLOTS has three levels).
const MAX_DEPTH: usize = 4;
/// What each array element costs of `read_value`'s budget beyond its bytes.
const ELEMENT_COST: usize = 16;

/// A socket whose read and write timeouts can be re-armed.
pub trait Transport: Read + Write + Send {
    fn set_timeouts(&mut self, t: Duration) -> io::Result<()>;
}

impl Transport for TcpStream {
    fn set_timeouts(&mut self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))?;
        self.set_write_timeout(Some(t))
    }
}

/// Appends one command in RESP (an array of bulk strings).
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses a RESP integer strictly: an optional '-' and 1 to 19 digits, nothing else.
pub fn parse_int(line: &[u8]) -> Option<i64> {
    let digits = line.strip_prefix(b"-").unwrap_or(line);
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(line).ok()?.parse().ok()
}

/// A connection's stream with its bounded reader.
pub struct RespStream<S: Transport> {
    stream: S,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Bytes read from the server so far.
    pub bytes_read: u64,
}

fn io_error(e: io::Error) -> RespError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => RespError::Timeout,
        io::ErrorKind::UnexpectedEof => RespError::Closed,
        _ => RespError::Io(e),
    }
}

impl<S: Transport> RespStream<S> {
    pub fn new(stream: S) -> Self {
        RespStream {
            stream,
            buf: vec![0u8; BUF_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            bytes_read: 0,
        }
    }

    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Writes all of `data` by the deadline.
    pub fn write_all(&mut self, mut data: &[u8], dl: &Deadline) -> Result<(), RespError> {
        while !data.is_empty() {
            let t = dl.remaining()?;
            self.stream.set_timeouts(t).map_err(io_error)?;
            match self.stream.write(data) {
                Ok(0) => return Err(RespError::Closed),
                Ok(n) => data = &data[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e)),
            }
        }
        let t = dl.remaining()?;
        self.stream.set_timeouts(t).map_err(io_error)?;
        self.stream.flush().map_err(io_error)
    }

    /// One read into `into` by the deadline (at least one byte).
    fn read_some(&mut self, into: &mut [u8], dl: &Deadline) -> Result<usize, RespError> {
        loop {
            let t = dl.remaining()?;
            self.stream.set_timeouts(t).map_err(io_error)?;
            match self.stream.read(into) {
                Ok(0) => return Err(RespError::Closed),
                Ok(n) => {
                    self.bytes_read += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e)),
            }
        }
    }

    /// Reads more into the buffer (after moving what is unread to its start).
    fn fill(&mut self, dl: &Deadline) -> Result<(), RespError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let mut buf = std::mem::take(&mut self.buf);
        let r = self.read_some(&mut buf[self.end..], dl);
        self.buf = buf;
        self.end += r?;
        Ok(())
    }

    /// The next line without its CRLF (at most `MAX_LINE` bytes with it).
    fn line(&mut self, dl: &Deadline) -> Result<Vec<u8>, RespError> {
        let mut scanned = 0;
        loop {
            let avail = &self.buf[self.start..self.end];
            if let Some(i) = avail[scanned..].windows(2).position(|w| w == b"\r\n") {
                let line = avail[..scanned + i].to_vec();
                self.start += scanned + i + 2;
                return Ok(line);
            }
            scanned = avail.len().saturating_sub(1);
            if avail.len() >= MAX_LINE {
                return Err(RespError::Protocol(format!(
                    "a line longer than {MAX_LINE} bytes"
                )));
            }
            self.fill(dl)?;
        }
    }

    /// Exactly `out.len()` bytes.
    fn exact(&mut self, out: &mut [u8], dl: &Deadline) -> Result<(), RespError> {
        let have = (self.end - self.start).min(out.len());
        out[..have].copy_from_slice(&self.buf[self.start..self.start + have]);
        self.start += have;
        let mut done = have;
        while done < out.len() {
            done += self.read_some(&mut out[done..], dl)?;
        }
        Ok(())
    }

    /// Reads one reply by the deadline; a bulk string longer than `max_bulk` is `Oversized`
    /// as soon as its length line is read; an array is a protocol error.
    pub fn read_reply(&mut self, max_bulk: usize, dl: &Deadline) -> Result<Reply, RespError> {
        let line = self.line(dl)?;
        self.finish(line, max_bulk, dl)
    }

    /// Reads one reply that may be an array, by the deadline, of at most `max_bytes` (its bulk
    /// strings, and `ELEMENT_COST` per element) and `MAX_DEPTH` levels.
    pub fn read_value(&mut self, max_bytes: usize, dl: &Deadline) -> Result<Value, RespError> {
        let mut budget = max_bytes;
        self.value(0, &mut budget, dl)
    }

    fn value(
        &mut self,
        depth: usize,
        budget: &mut usize,
        dl: &Deadline,
    ) -> Result<Value, RespError> {
        let line = self.line(dl)?;
        let Some(rest) = line.strip_prefix(b"*") else {
            let r = self.finish(line, *budget, dl)?;
            if let Reply::Bulk(b) = &r {
                *budget -= b.len();
            }
            return Ok(Value::Reply(r));
        };
        let n = parse_int(rest).ok_or_else(|| RespError::Protocol("array length".into()))?;
        if n == -1 {
            return Ok(Value::Reply(Reply::Nil));
        }
        let n = usize::try_from(n).map_err(|_| RespError::Protocol(format!("array of {n}")))?;
        if depth >= MAX_DEPTH {
            return Err(RespError::Protocol("arrays nested too deep".into()));
        }
        let cost = n.saturating_mul(ELEMENT_COST);
        if cost > *budget {
            return Err(RespError::Oversized {
                declared: cost as u64,
                bound: *budget,
            });
        }
        *budget -= cost;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.value(depth + 1, budget, dl)?);
        }
        Ok(Value::Array(out))
    }

    /// The rest of a reply whose first line is `line`.
    fn finish(
        &mut self,
        line: Vec<u8>,
        max_bulk: usize,
        dl: &Deadline,
    ) -> Result<Reply, RespError> {
        let (kind, rest) = match line.split_first() {
            Some((k, r)) => (*k, r),
            None => return Err(RespError::Protocol("an empty line".into())),
        };
        let text = || String::from_utf8_lossy(rest).into_owned();
        match kind {
            b'+' => Ok(Reply::Simple(text())),
            b'-' => Ok(Reply::Error(text())),
            b':' => parse_int(rest)
                .map(Reply::Int)
                .ok_or_else(|| RespError::Protocol(format!("integer {:?}", text()))),
            b'$' => {
                let n = parse_int(rest)
                    .ok_or_else(|| RespError::Protocol(format!("bulk length {:?}", text())))?;
                if n == -1 {
                    return Ok(Reply::Nil);
                }
                let n = u64::try_from(n)
                    .map_err(|_| RespError::Protocol(format!("bulk length {n}")))?;
                if n > max_bulk as u64 {
                    return Err(RespError::Oversized {
                        declared: n,
                        bound: max_bulk,
                    });
                }
                let mut v = vec![0u8; n as usize];
                self.exact(&mut v, dl)?;
                let mut crlf = [0u8; 2];
                self.exact(&mut crlf, dl)?;
                if &crlf != b"\r\n" {
                    return Err(RespError::Protocol(
                        "a bulk string longer than its length".into(),
                    ));
                }
                Ok(Reply::Bulk(v))
            }
            k => Err(RespError::Protocol(format!(
                "unexpected reply type {:?}",
                k as char
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    struct Mem(Cursor<Vec<u8>>);
    impl Read for Mem {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            // One byte at a time: every reply is split across reads.
            let n = b.len().min(1);
            self.0.read(&mut b[..n])
        }
    }
    impl Write for Mem {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Transport for Mem {
        fn set_timeouts(&mut self, _: Duration) -> io::Result<()> {
            Ok(())
        }
    }

    fn replies(bytes: &[u8], max: usize) -> Vec<Result<Reply, String>> {
        let mut s = RespStream::new(Mem(Cursor::new(bytes.to_vec())));
        let dl = Deadline::after(Duration::from_secs(5));
        let mut out = Vec::new();
        loop {
            match s.read_reply(max, &dl) {
                Ok(r) => out.push(Ok(r)),
                Err(RespError::Closed) => return out,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }

    #[test]
    fn well_formed_replies_parse_split_at_every_byte() {
        let r = replies(
            b"+OK\r\n:1\r\n:-0\r\n$3\r\na\r\n\r\n$-1\r\n-ERR no\r\n$0\r\n\r\n",
            3,
        );
        let ok: Vec<Reply> = r.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            ok,
            vec![
                Reply::Simple("OK".into()),
                Reply::Int(1),
                Reply::Int(0),
                Reply::Bulk(b"a\r\n".to_vec()),
                Reply::Nil,
                Reply::Error("ERR no".into()),
                Reply::Bulk(Vec::new()),
            ]
        );
    }

    #[test]
    fn bad_replies_are_errors_before_their_bytes_are_buffered() {
        let e = |b: &[u8]| replies(b, 8).pop().unwrap().unwrap_err();
        assert!(e(b"$9\r\n").contains("more than the 8 bytes"));
        assert!(e(b"$99999999999999999999\r\n").contains("bulk length"));
        assert!(e(b"$-2\r\n").contains("bulk length"));
        assert!(e(b":1x\r\n").contains("integer"));
        assert!(e(b": 1\r\n").contains("integer"));
        assert!(e(b":+1\r\n").contains("integer"));
        assert!(e(b"$2\r\nabc\r\n").contains("longer than its length"));
        assert!(e(b"*1\r\n").contains("reply type"));
        assert!(e(&[b'+'; MAX_LINE + 10]).contains("longer than"));
    }

    #[test]
    fn arrays_are_read_within_their_budget_and_depth() {
        let mut s = RespStream::new(Mem(Cursor::new(
            b"*2\r\n*3\r\n:0\r\n:5\r\n$2\r\nab\r\n$-1\r\n".to_vec(),
        )));
        let dl = Deadline::after(Duration::from_secs(5));
        let v = s.read_value(1024, &dl).unwrap();
        let r = |x| Value::Reply(x);
        assert_eq!(
            v,
            Value::Array(vec![
                Value::Array(vec![
                    r(Reply::Int(0)),
                    r(Reply::Int(5)),
                    r(Reply::Bulk(b"ab".to_vec()))
                ]),
                r(Reply::Nil)
            ])
        );
        let value = |b: &[u8], max: usize| {
            RespStream::new(Mem(Cursor::new(b.to_vec())))
                .read_value(max, &dl)
                .map_err(|e| e.to_string())
        };
        assert!(value(b"*1000000\r\n", 1024)
            .unwrap_err()
            .contains("more than"));
        assert!(value(b"*1\r\n$2000\r\n", 1024)
            .unwrap_err()
            .contains("more than"));
        assert!(value(b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n", 1024)
            .unwrap_err()
            .contains("too deep"));
        // `read_reply` takes no array.
        let mut s = RespStream::new(Mem(Cursor::new(b"*1\r\n:1\r\n".to_vec())));
        assert!(matches!(s.read_reply(8, &dl), Err(RespError::Protocol(_))));
    }

    #[test]
    fn integers_parse_strictly() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        for bad in [
            &b""[..],
            b"-",
            b"1.0",
            b"0x1",
            b"99999999999999999999",
            b" 1",
        ] {
            assert_eq!(parse_int(bad), None, "{bad:?}");
        }
    }
}
