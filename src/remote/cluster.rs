//! A Redis Cluster through kvblock's bounded connections (`conn`). Why not the `redis` crate's
//! cluster client: like its standalone one it reads a bulk reply of any announced length and
//! bounds one socket read, not a batch (see `resp`). Keys go to the master owning their hash
//! slot (CRC16 of the key, or of its `{hash tag}`, modulo 16384) in the map CLUSTER SLOTS
//! gives; each node's keys in one pipeline. Everything a batch does, connecting, refreshing the
//! map and every pipeline, ends by one deadline (`connect_timeout + io_timeout`). A node that
//! cannot be reached costs its keys only (`Unavailable`) and is not tried again before its
//! backoff; a MOVED reply (resharding, failover) refreshes the map and its key is retried once
//! within the same deadline; ASK, TRYAGAIN and CLUSTERDOWN are that key's error.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::conn::{Batch, Conn, Endpoint};
use super::redis::{Backoff, Counters, RedisConfig};
use super::resp::{Deadline, Reply, Value};
use super::store::{StoreError, StoreResult};
use crate::tier::io::lock;

/// Hash slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// A node's address.
pub type Node = (String, u16);

fn crc16(data: &[u8]) -> u16 {
    // CRC16-CCITT (XMODEM), the cluster's key hash.
    let mut crc = 0u16;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The hash slot of a key.
pub fn slot(key: &[u8]) -> usize {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|s| {
        let rest = &key[s + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&e| e > 0)
            .map(|e| &rest[..e])
    });
    crc16(tagged.unwrap_or(key)) as usize % SLOTS
}

/// Which master serves each slot.
struct SlotMap {
    nodes: Vec<Node>,
    /// Index into `nodes` per slot; `u16::MAX`: not served.
    owner: Vec<u16>,
}

impl SlotMap {
    /// Parses a CLUSTER SLOTS reply from `from` (an empty host is `from`'s).
    fn parse(v: &Value, from: &Node) -> Result<SlotMap, StoreError> {
        let bad = || StoreError::Protocol("a CLUSTER SLOTS reply that is not a slot map".into());
        let Value::Array(ranges) = v else {
            return Err(bad());
        };
        let mut map = SlotMap {
            nodes: Vec::new(),
            owner: vec![u16::MAX; SLOTS],
        };
        for r in ranges {
            let Value::Array(f) = r else {
                return Err(bad());
            };
            let (start, end, master) = match f.as_slice() {
                [Value::Reply(Reply::Int(s)), Value::Reply(Reply::Int(e)), Value::Array(m), ..] => {
                    (*s, *e, m)
                }
                _ => return Err(bad()),
            };
            let node = match master.as_slice() {
                [Value::Reply(Reply::Bulk(h)), Value::Reply(Reply::Int(p)), ..] => {
                    let host = String::from_utf8(h.clone()).map_err(|_| bad())?;
                    let port = u16::try_from(*p).map_err(|_| bad())?;
                    (
                        if host.is_empty() {
                            from.0.clone()
                        } else {
                            host
                        },
                        port,
                    )
                }
                _ => return Err(bad()),
            };
            if !(0 <= start && start <= end && end < SLOTS as i64) {
                return Err(bad());
            }
            let i = match map.nodes.iter().position(|n| *n == node) {
                Some(i) => i,
                None => {
                    map.nodes.push(node);
                    map.nodes.len() - 1
                }
            };
            for s in start..=end {
                map.owner[s as usize] = i as u16;
            }
        }
        Ok(map)
    }

    fn owner(&self, key: &[u8]) -> Option<&Node> {
        self.nodes.get(self.owner[slot(key)] as usize)
    }
}

/// The nodes, connections and slot map of one cluster.
pub(super) struct Cluster {
    base: Endpoint,
    seeds: Vec<Node>,
    cfg: RedisConfig,
    map: Mutex<Option<Arc<SlotMap>>>,
    idle: Mutex<HashMap<Node, Vec<Conn>>>,
    down: Mutex<HashMap<Node, Backoff>>,
}

fn timed_out() -> StoreError {
    StoreError::Timeout("the batch's deadline passed".into())
}

impl Cluster {
    pub fn new(base: Endpoint, seeds: Vec<Node>, cfg: RedisConfig) -> Cluster {
        Cluster {
            base,
            seeds,
            cfg,
            map: Mutex::new(None),
            idle: Mutex::new(HashMap::new()),
            down: Mutex::new(HashMap::new()),
        }
    }

    /// The deadline of one batch.
    pub fn deadline(&self) -> Deadline {
        Deadline::after(self.cfg.connect_timeout + self.cfg.io_timeout)
    }

    /// Opens a connection to `node` by the deadline (at most `connect_timeout`), unless the
    /// node is backing off.
    fn open(&self, node: &Node, dl: &Deadline, c: &Counters) -> StoreResult<Conn> {
        if lock(&self.down)
            .get(node)
            .is_some_and(|b| b.retry_at.is_some_and(|at| Instant::now() < at))
        {
            c.backoff_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(format!(
                "{}:{} unreachable; retrying after a backoff",
                node.0, node.1
            )));
        }
        let left = dl.remaining().map_err(|_| timed_out())?;
        let ep = Endpoint {
            host: node.0.clone(),
            port: node.1,
            ..self.base.clone()
        };
        match Conn::open(&ep, left.min(self.cfg.connect_timeout)) {
            Ok(conn) => {
                c.connects.fetch_add(1, Ordering::Relaxed);
                Ok(conn)
            }
            Err(e) => {
                c.connect_failures.fetch_add(1, Ordering::Relaxed);
                let mut down = lock(&self.down);
                down.entry(node.clone())
                    .or_default()
                    .failed(self.cfg.backoff_min, self.cfg.backoff_max);
                Err(e)
            }
        }
    }

    fn checkout(&self, node: &Node, dl: &Deadline, c: &Counters) -> StoreResult<Conn> {
        if let Some(conn) = lock(&self.idle).get_mut(node).and_then(Vec::pop) {
            return Ok(conn);
        }
        self.open(node, dl, c)
    }

    fn checkin(&self, node: &Node, conn: Conn) {
        lock(&self.down).remove(node);
        let mut idle = lock(&self.idle);
        let v = idle.entry(node.clone()).or_default();
        if v.len() < self.cfg.max_idle_connections {
            v.push(conn);
        }
    }

    /// Drops the idle connections to `node` (after one of them failed); returns how many.
    fn drop_idle(&self, node: &Node) -> u64 {
        lock(&self.idle).remove(node).map_or(0, |v| v.len() as u64)
    }

    /// Asks the known nodes, then the seeds, for the slot map, by the deadline.
    pub fn refresh(&self, dl: &Deadline, c: &Counters) -> StoreResult<()> {
        let mut candidates: Vec<Node> = lock(&self.map)
            .as_ref()
            .map(|m| m.nodes.clone())
            .unwrap_or_default();
        for s in &self.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        let mut last = StoreError::Unavailable("no cluster node answered".into());
        for node in candidates {
            let mut conn = match self.open(&node, dl, c) {
                Ok(conn) => conn,
                Err(e @ StoreError::Auth(_)) => return Err(e),
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let left = dl.remaining().map_err(|_| timed_out())?;
            let before = conn.bytes_read();
            let got = conn.cluster_slots(left);
            c.reply_bytes
                .fetch_add(conn.bytes_read() - before, Ordering::Relaxed);
            match got.and_then(|v| SlotMap::parse(&v, &node)) {
                Ok(map) => {
                    *lock(&self.map) = Some(Arc::new(map));
                    self.checkin(&node, conn);
                    return Ok(());
                }
                // A node that refuses the request (not a cluster, no permission) says so for all.
                Err(e @ (StoreError::Auth(_) | StoreError::Other(_))) => return Err(e),
                Err(e) => {
                    c.drops.fetch_add(1, Ordering::Relaxed);
                    last = e;
                }
            }
        }
        Err(last)
    }

    fn current_map(&self, dl: &Deadline, c: &Counters) -> StoreResult<Arc<SlotMap>> {
        if let Some(m) = lock(&self.map).clone() {
            return Ok(m);
        }
        self.refresh(dl, c)?;
        lock(&self.map).clone().ok_or_else(timed_out)
    }

    /// Runs one batch: `op` on each node's keys (their indices into `keys`), by one deadline.
    pub fn run<T: Clone>(
        &self,
        keys: &[&[u8]],
        c: &Counters,
        op: impl Fn(&mut Conn, &[usize], Duration) -> Batch<T>,
    ) -> Vec<StoreResult<T>> {
        let dl = self.deadline();
        let mut out: Vec<Option<StoreResult<T>>> = vec![None; keys.len()];
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        for attempt in 0..2 {
            let map = match self.current_map(&dl, c) {
                Ok(m) => m,
                Err(e) => {
                    for &i in &todo {
                        out[i] = Some(Err(e.clone()));
                    }
                    break;
                }
            };
            let mut groups: HashMap<&Node, Vec<usize>> = HashMap::new();
            for &i in &todo {
                match map.owner(keys[i]) {
                    Some(n) => groups.entry(n).or_default().push(i),
                    None => {
                        let m = format!("slot {} is not served", slot(keys[i]));
                        out[i] = Some(Err(StoreError::Other(m)));
                    }
                }
            }
            let mut moved = Vec::new();
            for (node, idxs) in groups {
                for (i, r) in idxs.iter().zip(self.on_node(node, &idxs, &dl, c, &op)) {
                    let is_moved =
                        matches!(&r, Err(StoreError::Other(m)) if m.starts_with("MOVED "));
                    if is_moved && attempt == 0 {
                        moved.push(*i);
                    } else {
                        out[*i] = Some(r);
                    }
                }
            }
            if moved.is_empty() {
                break;
            }
            // The map changed: ask for it again, then retry those keys once.
            *lock(&self.map) = None;
            todo = moved;
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(timed_out())))
            .collect()
    }

    fn on_node<T: Clone>(
        &self,
        node: &Node,
        idxs: &[usize],
        dl: &Deadline,
        c: &Counters,
        op: &impl Fn(&mut Conn, &[usize], Duration) -> Batch<T>,
    ) -> Vec<StoreResult<T>> {
        let mut conn = match self.checkout(node, dl, c) {
            Ok(conn) => conn,
            Err(e) => {
                // The node may have left the cluster: the next batch asks for the map again.
                *lock(&self.map) = None;
                return vec![Err(e); idxs.len()];
            }
        };
        let Ok(left) = dl.remaining() else {
            self.checkin(node, conn);
            return vec![Err(timed_out()); idxs.len()];
        };
        let before = conn.bytes_read();
        let (res, broke) = op(&mut conn, idxs, left);
        c.reply_bytes
            .fetch_add(conn.bytes_read() - before, Ordering::Relaxed);
        if broke.is_none() {
            self.checkin(node, conn);
        } else {
            // As on a standalone server: the batches behind do not wait on a broken node.
            c.drops
                .fetch_add(1 + self.drop_idle(node), Ordering::Relaxed);
            lock(&self.down)
                .entry(node.clone())
                .or_default()
                .failed(self.cfg.backoff_min, self.cfg.backoff_max);
        }
        res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // From the Redis Cluster specification: CRC16("123456789") is 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") as usize % SLOTS);
    }

    #[test]
    fn a_slot_map_is_parsed_and_bad_ones_refused() {
        let int = |i| Value::Reply(Reply::Int(i));
        let bulk = |s: &str| Value::Reply(Reply::Bulk(s.as_bytes().to_vec()));
        let range = |s, e, h: &str, p| {
            Value::Array(vec![int(s), int(e), Value::Array(vec![bulk(h), int(p)])])
        };
        let from = ("10.0.0.9".to_string(), 7000);
        let v = Value::Array(vec![
            range(0, 8191, "", 7000),
            range(8192, 16383, "h2", 7001),
        ]);
        let m = SlotMap::parse(&v, &from).unwrap();
        assert_eq!(m.nodes, vec![from.clone(), ("h2".to_string(), 7001)]);
        assert_eq!(m.owner(b"foo"), Some(&("h2".to_string(), 7001)));
        let partial = Value::Array(vec![range(0, 100, "h", 1)]);
        assert_eq!(SlotMap::parse(&partial, &from).unwrap().owner(b"foo"), None);
        for bad in [
            Value::Array(vec![range(5, 4, "h", 1)]),
            Value::Array(vec![range(0, 16384, "h", 1)]),
            Value::Array(vec![range(0, 1, "h", 70000)]),
            Value::Array(vec![int(1)]),
            int(3),
        ] {
            assert!(SlotMap::parse(&bad, &from).is_err(), "{bad:?}");
        }
    }
}
