//! Payload bytes handed to ZeroMQ and not yet released by it.
//!
//! A batch payload is sent without copying (`zmq_msg_init_data`): ZeroMQ keeps a reference to
//! the shared payload until it has written it to the peer's connection (or dropped it with the
//! connection), then calls `release`, which gives the bytes back to every account they were
//! charged to. So an account holds exactly what sits in ZeroMQ's queues on behalf of a peer, of
//! the replay socket, or of the whole publisher, and the publisher can refuse to queue more.

use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes queued in ZeroMQ under one heading, and the most ever queued at once.
#[derive(Debug, Default)]
pub struct ByteAccount {
    bytes: AtomicU64,
    peak: AtomicU64,
}

impl ByteAccount {
    /// Bytes queued now.
    pub fn get(&self) -> u64 {
        self.bytes.load(Ordering::Acquire)
    }

    /// The most bytes queued at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Whether `more` bytes fit under `limit`. One message always fits into an empty account,
    /// so that a single batch larger than the limit is still delivered (alone).
    pub fn fits(&self, more: usize, limit: usize) -> bool {
        let now = self.get();
        now == 0 || now.saturating_add(more as u64) <= limit as u64
    }

    fn add(&self, n: u64) {
        let now = self.bytes.fetch_add(n, Ordering::AcqRel) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, n: u64) {
        self.bytes.fetch_sub(n, Ordering::AcqRel);
    }
}

/// What ZeroMQ holds while a tracked frame is queued.
struct InFlight {
    payload: Arc<[u8]>,
    accounts: Vec<Arc<ByteAccount>>,
}

/// Called by ZeroMQ (on any of its threads) when it no longer needs the frame's bytes.
unsafe extern "C" fn release(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the box leaked by `send_tracked` for this frame; ZeroMQ calls this once.
    let f = unsafe { Box::from_raw(hint.cast::<InFlight>()) };
    let n = f.payload.len() as u64;
    for a in &f.accounts {
        a.sub(n);
    }
}

/// Sends `payload` as one frame (`flags` as for `zmq::Socket::send`) without copying it; its
/// length is charged to `accounts` until ZeroMQ releases it (at once when the send fails).
pub fn send_tracked(
    socket: &mut zmq::Socket,
    payload: &Arc<[u8]>,
    accounts: &[&Arc<ByteAccount>],
    flags: i32,
) -> Result<(), zmq::Error> {
    if payload.is_empty() {
        return socket.send(&[][..], flags);
    }
    let n = payload.len() as u64;
    for a in accounts {
        a.add(n);
    }
    let hint = Box::into_raw(Box::new(InFlight {
        payload: payload.clone(),
        accounts: accounts.iter().map(|a| Arc::clone(a)).collect(),
    }));
    let mut msg = zmq_sys::zmq_msg_t::default();
    // SAFETY: the data stays alive and unchanged while `hint` holds its Arc; `release` frees
    // the hint exactly once (when ZeroMQ is done with the frame, or when we close it below).
    unsafe {
        let rc = zmq_sys::zmq_msg_init_data(
            &mut msg,
            payload.as_ptr() as *mut c_void,
            payload.len(),
            Some(release),
            hint.cast::<c_void>(),
        );
        if rc != 0 {
            // Not initialised: ZeroMQ never took the hint.
            let err = zmq::Error::from_raw(zmq_sys::zmq_errno());
            release(std::ptr::null_mut(), hint.cast::<c_void>());
            return Err(err);
        }
        if zmq_sys::zmq_msg_send(&mut msg, socket.as_mut_ptr(), flags) >= 0 {
            // ZeroMQ owns the frame now.
            return Ok(());
        }
        let err = zmq::Error::from_raw(zmq_sys::zmq_errno());
        // Not sent: closing it calls `release`.
        zmq_sys::zmq_msg_close(&mut msg);
        Err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_charged_until_zeromq_releases_them() {
        let ctx = zmq::Context::new();
        let mut tx = ctx.socket(zmq::PAIR).unwrap();
        let rx = ctx.socket(zmq::PAIR).unwrap();
        tx.bind("inproc://account-test").unwrap();
        rx.connect("inproc://account-test").unwrap();
        let a = Arc::new(ByteAccount::default());
        let payload: Arc<[u8]> = vec![7u8; 1000].into();
        send_tracked(&mut tx, &payload, &[&a], 0).unwrap();
        send_tracked(&mut tx, &payload, &[&a], 0).unwrap();
        assert_eq!(a.get(), 2000);
        assert_eq!(rx.recv_bytes(0).unwrap(), vec![7u8; 1000]);
        assert_eq!(rx.recv_bytes(0).unwrap().len(), 1000);
        // inproc hands the frame itself to the receiver, which closed it.
        assert_eq!(a.get(), 0);
        assert_eq!(a.peak(), 2000);
        assert!(a.fits(5000, 10));
    }

    #[test]
    fn a_failed_send_gives_the_bytes_back() {
        let ctx = zmq::Context::new();
        let mut tx = ctx.socket(zmq::ROUTER).unwrap();
        tx.set_router_mandatory(true).unwrap();
        tx.bind("inproc://account-fail").unwrap();
        let a = Arc::new(ByteAccount::default());
        tx.send(&b"nobody"[..], zmq::SNDMORE).unwrap_err();
        let payload: Arc<[u8]> = vec![1u8; 10].into();
        // A payload frame alone to a ROUTER names no peer: refused.
        let _ = send_tracked(&mut tx, &payload, &[&a], zmq::DONTWAIT);
        assert_eq!(a.get(), 0);
    }
}
