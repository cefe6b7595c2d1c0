//! An in-process transfer backend for tests: several agents live on one `LoopbackHub` in one
//! process and move DRAM between each other with memcpy.
//!
//! Every transfer is checked before it is accepted: local descriptors inside the poster's
//! registered regions, remote ones inside the peer's regions as its metadata announced them
//! AND as they are registered at the hub at that moment. A garbage descriptor is an error,
//! never a wild write. Held transfers are checked again when they complete.
//!
//! Fault injection (for the block-lifecycle tests), one-shot, per agent or for the whole hub
//! (the agent's queue is consulted first):
//! - default: a post completes at once (data copied, notification delivered, state Done);
//! - `hold_next`: the next post stays InProgress until `finish(xfer)` (copies, notifies, Done)
//!   or `fail(xfer, why)` (nothing copied, no notification, Failed);
//! - `fail_next`: the next post is accepted but ends Failed at once (nothing copied);
//! - `refuse_next`: the next post returns `KvError::Transfer` (nothing posted).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::backend::{
    check_pairs, Desc, MemKind, Region, TransferBackend, XferId, XferOp, XferState,
};
use super::regions::{decode_metadata, encode_metadata, RegionTable};
use crate::error::{KvError, KvResult};

const TAG: &str = "loopback";

#[derive(Clone, Debug)]
enum Fault {
    Hold,
    Fail(String),
    Refuse(String),
}

#[derive(Default)]
struct Slot {
    regions: RegionTable,
    inbox: Vec<(String, Vec<u8>)>,
    faults: VecDeque<Fault>,
}

struct Xfer {
    owner: String,
    peer: String,
    op: XferOp,
    local: Vec<Desc>,
    remote: Vec<Desc>,
    notification: Vec<u8>,
    state: XferState,
}

#[derive(Default)]
struct Hub {
    agents: HashMap<String, Slot>,
    xfers: HashMap<XferId, Xfer>,
    next_xfer: u64,
    faults: VecDeque<Fault>,
}

/// A set of in-process agents that can transfer to each other. Cloning shares the hub.
#[derive(Clone, Default)]
pub struct LoopbackHub {
    inner: Arc<Mutex<Hub>>,
}

/// One agent of a `LoopbackHub`; dropping it removes the agent (its regions and transfers).
pub struct LoopbackAgent {
    hub: LoopbackHub,
    name: String,
    /// Peers added with `add_peer`: their regions as their metadata announced them.
    peers: HashMap<String, RegionTable>,
}

impl LoopbackHub {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Hub> {
        // A panicking test thread must not wedge the others: the hub's data stays consistent
        // between statements, so a poisoned lock is taken over.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new agent named `name` on this hub; refused if the name is taken.
    pub fn agent(&self, name: &str) -> KvResult<LoopbackAgent> {
        if name.is_empty() {
            return Err(KvError::InvalidArgument("empty agent name".into()));
        }
        let mut hub = self.lock();
        if hub.agents.contains_key(name) {
            return Err(KvError::InvalidArgument(format!(
                "agent {name:?} already exists on this hub"
            )));
        }
        hub.agents.insert(name.to_string(), Slot::default());
        Ok(LoopbackAgent {
            hub: self.clone(),
            name: name.to_string(),
            peers: HashMap::new(),
        })
    }

    fn push_fault(&self, agent: Option<&str>, fault: Fault) -> KvResult<()> {
        let mut hub = self.lock();
        match agent {
            None => hub.faults.push_back(fault),
            Some(name) => hub
                .agents
                .get_mut(name)
                .ok_or_else(|| KvError::InvalidArgument(format!("no agent {name:?}")))?
                .faults
                .push_back(fault),
        }
        Ok(())
    }

    /// The next post (by any agent) stays InProgress until `finish` or `fail`.
    pub fn hold_next(&self) {
        let _ = self.push_fault(None, Fault::Hold);
    }
    /// The next post (by any agent) is accepted and ends Failed at once.
    pub fn fail_next(&self, why: &str) {
        let _ = self.push_fault(None, Fault::Fail(why.to_string()));
    }
    /// The next post (by any agent) is refused with `KvError::Transfer`.
    pub fn refuse_next(&self, why: &str) {
        let _ = self.push_fault(None, Fault::Refuse(why.to_string()));
    }
    /// `hold_next` for the next post of agent `agent` only.
    pub fn hold_next_on(&self, agent: &str) -> KvResult<()> {
        self.push_fault(Some(agent), Fault::Hold)
    }
    pub fn fail_next_on(&self, agent: &str, why: &str) -> KvResult<()> {
        self.push_fault(Some(agent), Fault::Fail(why.to_string()))
    }
    pub fn refuse_next_on(&self, agent: &str, why: &str) -> KvResult<()> {
        self.push_fault(Some(agent), Fault::Refuse(why.to_string()))
    }

    /// Completes a held transfer: copies its data (if both sides are still registered),
    /// delivers its notification, state Done (or Failed when a side went away).
    pub fn finish(&self, xfer: XferId) -> KvResult<()> {
        let mut hub = self.lock();
        held(&hub, xfer)?;
        complete(&mut hub, xfer);
        Ok(())
    }

    /// Ends a held transfer as Failed: nothing copied, no notification.
    pub fn fail(&self, xfer: XferId, why: &str) -> KvResult<()> {
        let mut hub = self.lock();
        held(&hub, xfer)?;
        hub.xfers.get_mut(&xfer).unwrap().state = XferState::Failed(why.to_string());
        Ok(())
    }

    /// The transfers still InProgress (held), oldest first.
    pub fn held(&self) -> Vec<XferId> {
        let hub = self.lock();
        let mut ids: Vec<XferId> = hub
            .xfers
            .iter()
            .filter(|(_, x)| x.state == XferState::InProgress)
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        ids
    }
}

fn held(hub: &Hub, xfer: XferId) -> KvResult<()> {
    match hub.xfers.get(&xfer).map(|x| &x.state) {
        Some(XferState::InProgress) => Ok(()),
        Some(s) => Err(KvError::InvalidArgument(format!(
            "transfer {xfer:?} is not held (it is {s:?})"
        ))),
        None => Err(KvError::InvalidArgument(format!(
            "no transfer {xfer:?} on this hub"
        ))),
    }
}

/// Checks both sides against the live registrations, copies, notifies.
fn complete(hub: &mut Hub, id: XferId) {
    let x = &hub.xfers[&id];
    let checked = (|| -> KvResult<()> {
        let owner = hub
            .agents
            .get(&x.owner)
            .ok_or_else(|| KvError::Transfer(format!("agent {:?} is gone", x.owner)))?;
        let peer = hub
            .agents
            .get(&x.peer)
            .ok_or_else(|| KvError::Transfer(format!("peer {:?} is gone", x.peer)))?;
        owner.regions.kind_of("local", &x.local)?;
        peer.regions
            .kind_of(&format!("remote (agent {:?})", x.peer), &x.remote)?;
        Ok(())
    })();
    let state = match checked {
        Err(e) => XferState::Failed(e.to_string()),
        Ok(()) => {
            for (l, r) in x.local.iter().zip(&x.remote) {
                let (src, dst) = match x.op {
                    XferOp::Write => (l.addr, r.addr),
                    XferOp::Read => (r.addr, l.addr),
                };
                // SAFETY: both ranges lie inside DRAM regions registered at the hub right now
                // (checked above), which their owners promised are valid memory while
                // registered; `copy` allows the two ranges to overlap.
                unsafe {
                    std::ptr::copy(src as *const u8, dst as *mut u8, l.len as usize);
                }
            }
            if !x.notification.is_empty() {
                let msg = (x.owner.clone(), x.notification.clone());
                let peer = x.peer.clone();
                hub.agents.get_mut(&peer).unwrap().inbox.push(msg);
            }
            XferState::Done
        }
    };
    hub.xfers.get_mut(&id).unwrap().state = state;
}

impl LoopbackAgent {
    /// The hub this agent lives on.
    pub fn hub(&self) -> &LoopbackHub {
        &self.hub
    }
    /// `LoopbackHub::hold_next_on` for this agent.
    pub fn hold_next(&self) {
        let _ = self.hub.hold_next_on(&self.name);
    }
    pub fn fail_next(&self, why: &str) {
        let _ = self.hub.fail_next_on(&self.name, why);
    }
    pub fn refuse_next(&self, why: &str) {
        let _ = self.hub.refuse_next_on(&self.name, why);
    }
    pub fn finish(&self, xfer: XferId) -> KvResult<()> {
        self.hub.finish(xfer)
    }
    pub fn fail(&self, xfer: XferId, why: &str) -> KvResult<()> {
        self.hub.fail(xfer, why)
    }
}

impl Drop for LoopbackAgent {
    fn drop(&mut self) {
        let mut hub = self.hub.lock();
        hub.agents.remove(&self.name);
        let name = &self.name;
        hub.xfers.retain(|_, x| &x.owner != name);
    }
}

impl TransferBackend for LoopbackAgent {
    fn agent_name(&self) -> &str {
        &self.name
    }

    fn register(&mut self, region: &Region) -> KvResult<()> {
        if region.kind != MemKind::Dram {
            return Err(KvError::Unsupported(
                "the loopback backend moves DRAM only".into(),
            ));
        }
        let mut hub = self.hub.lock();
        let slot = hub.agents.get_mut(&self.name).unwrap();
        slot.regions.insert(region).map(|_| ())
    }

    fn deregister(&mut self, region: &Region) -> KvResult<()> {
        let mut hub = self.hub.lock();
        let busy = hub.xfers.values().any(|x| {
            x.owner == self.name && x.local.iter().any(|d| RegionTable::overlaps(region, d))
        });
        if busy {
            return Err(KvError::InvalidArgument(format!(
                "region {:#x}+{} is used by a transfer not yet released",
                region.addr, region.len
            )));
        }
        let slot = hub.agents.get_mut(&self.name).unwrap();
        slot.regions.remove(region).map(|_| ())
    }

    fn local_metadata(&mut self) -> KvResult<Vec<u8>> {
        let hub = self.hub.lock();
        let regions = &hub.agents[&self.name].regions;
        Ok(encode_metadata(TAG, &self.name, regions, &[]))
    }

    fn add_peer(&mut self, metadata: &[u8]) -> KvResult<String> {
        let info = decode_metadata(TAG, metadata)?;
        if !self.hub.lock().agents.contains_key(&info.agent) {
            return Err(KvError::Transfer(format!(
                "agent {:?} does not live on this hub",
                info.agent
            )));
        }
        self.peers.insert(info.agent.clone(), info.regions);
        Ok(info.agent)
    }

    fn remove_peer(&mut self, peer: &str) -> KvResult<()> {
        self.peers
            .remove(peer)
            .map(|_| ())
            .ok_or_else(|| KvError::InvalidArgument(format!("unknown peer {peer:?}")))
    }

    fn post(
        &mut self,
        op: XferOp,
        local: &[Desc],
        peer: &str,
        remote: &[Desc],
        notification: &[u8],
    ) -> KvResult<XferId> {
        check_pairs(local, remote)?;
        let announced = self
            .peers
            .get(peer)
            .ok_or_else(|| KvError::InvalidArgument(format!("unknown peer {peer:?}")))?;
        let side = format!("remote (agent {peer:?})");
        announced.kind_of(&side, remote)?;
        let mut hub = self.hub.lock();
        hub.agents[&self.name].regions.kind_of("local", local)?;
        hub.agents
            .get(peer)
            .ok_or_else(|| KvError::Transfer(format!("peer {peer:?} is gone")))?
            .regions
            .kind_of(&side, remote)?;
        let fault = match hub.agents.get_mut(&self.name).unwrap().faults.pop_front() {
            Some(f) => Some(f),
            None => hub.faults.pop_front(),
        };
        if let Some(Fault::Refuse(why)) = &fault {
            return Err(KvError::Transfer(format!("post refused: {why}")));
        }
        let id = XferId(hub.next_xfer);
        hub.next_xfer += 1;
        let state = match &fault {
            Some(Fault::Fail(why)) => XferState::Failed(why.clone()),
            _ => XferState::InProgress,
        };
        hub.xfers.insert(
            id,
            Xfer {
                owner: self.name.clone(),
                peer: peer.to_string(),
                op,
                local: local.to_vec(),
                remote: remote.to_vec(),
                notification: notification.to_vec(),
                state,
            },
        );
        if fault.is_none() {
            complete(&mut hub, id);
        }
        Ok(id)
    }

    fn state(&mut self, xfer: XferId) -> XferState {
        match self.hub.lock().xfers.get(&xfer) {
            Some(x) if x.owner == self.name => x.state.clone(),
            _ => XferState::Failed(format!("unknown transfer {xfer:?}")),
        }
    }

    fn release(&mut self, xfer: XferId) -> KvResult<()> {
        let mut hub = self.hub.lock();
        match hub.xfers.get(&xfer) {
            Some(x) if x.owner == self.name => {
                if x.state == XferState::InProgress {
                    return Err(KvError::InvalidArgument(format!(
                        "transfer {xfer:?} is still in progress"
                    )));
                }
                hub.xfers.remove(&xfer);
                Ok(())
            }
            _ => Err(KvError::InvalidArgument(format!(
                "unknown transfer {xfer:?}"
            ))),
        }
    }

    fn send_notification(&mut self, peer: &str, message: &[u8]) -> KvResult<()> {
        if !self.peers.contains_key(peer) {
            return Err(KvError::InvalidArgument(format!("unknown peer {peer:?}")));
        }
        let mut hub = self.hub.lock();
        let slot = hub
            .agents
            .get_mut(peer)
            .ok_or_else(|| KvError::Transfer(format!("peer {peer:?} is gone")))?;
        slot.inbox.push((self.name.clone(), message.to_vec()));
        Ok(())
    }

    fn take_notifications(&mut self) -> KvResult<Vec<(String, Vec<u8>)>> {
        let mut hub = self.hub.lock();
        Ok(std::mem::take(
            &mut hub.agents.get_mut(&self.name).unwrap().inbox,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 64;

    struct Side {
        agent: LoopbackAgent,
        buf: Vec<u8>,
    }

    impl Side {
        fn new(hub: &LoopbackHub, name: &str, fill: u8) -> Side {
            let buf = vec![fill; 16 * BLOCK as usize];
            let mut agent = hub.agent(name).unwrap();
            agent.register(&Self::region_of(&buf)).unwrap();
            Side { agent, buf }
        }
        fn region_of(buf: &[u8]) -> Region {
            Region {
                addr: buf.as_ptr() as u64,
                len: buf.len() as u64,
                kind: MemKind::Dram,
            }
        }
        fn block(&self, i: u64) -> Desc {
            Desc {
                addr: self.buf.as_ptr() as u64 + i * BLOCK,
                len: BLOCK,
            }
        }
    }

    /// Two agents that know each other; `a` all 1s, `b` all 2s.
    fn pair(hub: &LoopbackHub) -> (Side, Side) {
        let mut a = Side::new(hub, "prefill", 1);
        let mut b = Side::new(hub, "decode", 2);
        let ma = a.agent.local_metadata().unwrap();
        let mb = b.agent.local_metadata().unwrap();
        assert_eq!(a.agent.add_peer(&mb).unwrap(), "decode");
        assert_eq!(b.agent.add_peer(&ma).unwrap(), "prefill");
        (a, b)
    }

    #[test]
    fn write_and_read_copy_and_notify() {
        let hub = LoopbackHub::new();
        let (mut a, mut b) = pair(&hub);
        let x = a
            .agent
            .post(
                XferOp::Write,
                &[a.block(0), a.block(1)],
                "decode",
                &[b.block(5), b.block(9)],
                b"req-7",
            )
            .unwrap();
        assert_eq!(a.agent.state(x), XferState::Done);
        assert_eq!(&b.buf[5 * 64..6 * 64], &[1u8; 64][..]);
        assert_eq!(&b.buf[9 * 64..10 * 64], &[1u8; 64][..]);
        assert_eq!(b.buf.iter().filter(|&&v| v == 1).count(), 128);
        assert_eq!(
            b.agent.take_notifications().unwrap(),
            vec![("prefill".to_string(), b"req-7".to_vec())]
        );
        assert!(b.agent.take_notifications().unwrap().is_empty());
        a.agent.release(x).unwrap();
        assert!(matches!(a.agent.state(x), XferState::Failed(_)));
        assert!(a.agent.release(x).is_err());

        // READ: remote -> local, no notification when empty.
        let y = a
            .agent
            .post(XferOp::Read, &[a.block(3)], "decode", &[b.block(0)], b"")
            .unwrap();
        assert_eq!(a.agent.state(y), XferState::Done);
        assert_eq!(&a.buf[3 * 64..4 * 64], &[2u8; 64][..]);
        assert!(b.agent.take_notifications().unwrap().is_empty());

        b.agent.send_notification("prefill", b"ack").unwrap();
        assert_eq!(
            a.agent.take_notifications().unwrap(),
            vec![("decode".to_string(), b"ack".to_vec())]
        );
    }

    #[test]
    fn garbage_descriptors_are_refused_and_nothing_moves() {
        let hub = LoopbackHub::new();
        let (mut a, b) = pair(&hub);
        let outside = Desc {
            addr: b.buf.as_ptr() as u64 + 16 * BLOCK,
            len: BLOCK,
        };
        let straddle = Desc {
            addr: b.buf.as_ptr() as u64 + 15 * BLOCK + 1,
            len: BLOCK,
        };
        let wild = Desc {
            addr: 0x1000,
            len: BLOCK,
        };
        for (l, r) in [
            (vec![a.block(0)], vec![outside]),
            (vec![a.block(0)], vec![straddle]),
            (vec![a.block(0)], vec![wild]),
            (vec![wild], vec![b.block(0)]),
            (vec![a.block(0)], vec![b.block(0), b.block(1)]),
            (
                vec![a.block(0)],
                vec![Desc {
                    addr: b.block(0).addr,
                    len: 32,
                }],
            ),
            (vec![], vec![]),
        ] {
            let e = a
                .agent
                .post(XferOp::Write, &l, "decode", &r, b"x")
                .unwrap_err();
            assert!(matches!(e, KvError::InvalidArgument(_)), "{e}");
        }
        assert!(a
            .agent
            .post(XferOp::Write, &[a.block(0)], "nobody", &[b.block(0)], b"")
            .is_err());
        assert!(b.buf.iter().all(|&v| v == 2));
        drop(b);
        assert!(hub.held().is_empty());
    }

    #[test]
    fn remote_regions_are_checked_live_too() {
        let hub = LoopbackHub::new();
        let (mut a, mut b) = pair(&hub);
        // b deregisters after announcing its region: a's snapshot says yes, the hub says no.
        b.agent.deregister(&Side::region_of(&b.buf)).unwrap();
        let e = a
            .agent
            .post(XferOp::Write, &[a.block(0)], "decode", &[b.block(0)], b"")
            .unwrap_err();
        assert!(matches!(e, KvError::InvalidArgument(_)), "{e}");
        assert!(b.buf.iter().all(|&v| v == 2));
    }

    #[test]
    fn held_transfer_waits_for_finish_or_fail() {
        let hub = LoopbackHub::new();
        let (mut a, mut b) = pair(&hub);
        a.agent.hold_next();
        let x = a
            .agent
            .post(XferOp::Write, &[a.block(0)], "decode", &[b.block(0)], b"n1")
            .unwrap();
        assert_eq!(a.agent.state(x), XferState::InProgress);
        assert_eq!(hub.held(), vec![x]);
        assert!(
            a.agent.release(x).is_err(),
            "release refused while in progress"
        );
        assert!(a.agent.deregister(&Side::region_of(&a.buf)).is_err());
        assert!(b.buf.iter().all(|&v| v == 2), "no data before finish");
        assert!(b.agent.take_notifications().unwrap().is_empty());
        hub.finish(x).unwrap();
        assert_eq!(a.agent.state(x), XferState::Done);
        assert_eq!(&b.buf[..64], &[1u8; 64][..]);
        assert_eq!(b.agent.take_notifications().unwrap().len(), 1);
        assert!(hub.finish(x).is_err(), "only held transfers finish");
        a.agent.release(x).unwrap();

        // Hub-wide hold, then fail: nothing copied, no notification.
        hub.hold_next();
        let y = a
            .agent
            .post(XferOp::Write, &[a.block(1)], "decode", &[b.block(1)], b"n2")
            .unwrap();
        // The next post is not held any more.
        let z = a
            .agent
            .post(XferOp::Write, &[a.block(2)], "decode", &[b.block(2)], b"")
            .unwrap();
        assert_eq!(a.agent.state(z), XferState::Done);
        hub.fail(y, "link down").unwrap();
        assert_eq!(a.agent.state(y), XferState::Failed("link down".into()));
        assert_eq!(&b.buf[64..128], &[2u8; 64][..]);
        assert!(b.agent.take_notifications().unwrap().is_empty());
        a.agent.release(y).unwrap();
        a.agent.release(z).unwrap();
        a.agent.deregister(&Side::region_of(&a.buf)).unwrap();
    }

    #[test]
    fn held_transfer_to_a_departed_peer_fails_at_finish() {
        let hub = LoopbackHub::new();
        let (mut a, b) = pair(&hub);
        a.agent.hold_next();
        let x = a
            .agent
            .post(XferOp::Write, &[a.block(0)], "decode", &[b.block(0)], b"")
            .unwrap();
        drop(b); // its buffer is freed too: finishing must not write there
        hub.finish(x).unwrap();
        assert!(matches!(a.agent.state(x), XferState::Failed(_)));
    }

    #[test]
    fn fail_next_and_refuse_next() {
        let hub = LoopbackHub::new();
        let (mut a, mut b) = pair(&hub);
        a.agent.fail_next("injected");
        let x = a
            .agent
            .post(XferOp::Write, &[a.block(0)], "decode", &[b.block(0)], b"n")
            .unwrap();
        assert_eq!(a.agent.state(x), XferState::Failed("injected".into()));
        assert!(b.buf.iter().all(|&v| v == 2));
        assert!(b.agent.take_notifications().unwrap().is_empty());
        a.agent.release(x).unwrap();

        hub.refuse_next("no resources");
        let e = a
            .agent
            .post(XferOp::Write, &[a.block(0)], "decode", &[b.block(0)], b"n")
            .unwrap_err();
        assert!(matches!(e, KvError::Transfer(_)), "{e}");
        assert!(b.buf.iter().all(|&v| v == 2));
        // Per agent: b's fault does not touch a's posts.
        hub.refuse_next_on("decode", "b only").unwrap();
        let ok = a
            .agent
            .post(XferOp::Write, &[a.block(0)], "decode", &[b.block(0)], b"")
            .unwrap();
        assert_eq!(a.agent.state(ok), XferState::Done);
        assert!(b
            .agent
            .post(XferOp::Read, &[b.block(3)], "prefill", &[a.block(3)], b"")
            .is_err());
        assert!(hub.hold_next_on("nobody").is_err());
    }

    #[test]
    fn registration_rules_and_names() {
        let hub = LoopbackHub::new();
        let mut a = hub.agent("a").unwrap();
        assert!(hub.agent("a").is_err());
        let buf = vec![0u8; 256];
        let r = Side::region_of(&buf);
        a.register(&r).unwrap();
        a.register(&r).unwrap(); // idempotent
        assert!(a.register(&Region { len: 128, ..r }).is_err()); // overlaps
        assert!(matches!(
            a.register(&Region {
                addr: 1 << 40,
                len: 64,
                kind: MemKind::Vram { device: 0 }
            }),
            Err(KvError::Unsupported(_))
        ));
        a.deregister(&r).unwrap();
        assert!(a.deregister(&r).is_err());
        // Metadata of another backend or of an agent not on this hub.
        let other = LoopbackHub::new();
        let mut stranger = other.agent("s").unwrap();
        let md = stranger.local_metadata().unwrap();
        assert!(matches!(a.add_peer(&md), Err(KvError::Transfer(_))));
        assert!(a.add_peer(b"not metadata").is_err());
        assert!(a.remove_peer("s").is_err());
        drop(a);
        assert!(hub.agent("a").is_ok(), "a dropped agent frees its name");
    }
}
