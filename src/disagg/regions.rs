//! Registered regions of one agent, and the metadata envelope that carries them to a peer.
//!
//! Both backends wrap their metadata in the same envelope: the backend's tag, the agent's name,
//! its registered regions, then the backend's own bytes (nothing for the loopback hub, NIXL's
//! blob for NIXL). So every backend can check remote descriptors before it posts them, and a
//! blob from another backend is refused with a clear error.

use super::backend::{desc_end, Desc, MemKind, Region};
use crate::error::{KvError, KvResult};

/// The regions an agent registered, sorted by address, never overlapping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionTable {
    regions: Vec<Region>,
}

impl RegionTable {
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// Adds a region. Ok(false) when exactly this (addr, len, kind) is already there; refuses an
    /// empty or overflowing range, the same (addr, len) with another kind, and any overlap.
    pub fn insert(&mut self, region: &Region) -> KvResult<bool> {
        let end = desc_end("region", region.addr, region.len)?;
        let at = self.regions.partition_point(|r| r.addr < region.addr);
        if let Some(same) = self
            .regions
            .get(at)
            .filter(|r| r.addr == region.addr && r.len == region.len)
        {
            if same.kind == region.kind {
                return Ok(false);
            }
            return Err(KvError::InvalidArgument(format!(
                "region {:#x}+{} is already registered as {:?}, not {:?}",
                region.addr, region.len, same.kind, region.kind
            )));
        }
        let before = at.checked_sub(1).map(|i| &self.regions[i]);
        let overlaps_before = before.is_some_and(|b| b.addr + b.len > region.addr);
        let overlaps_after = self.regions.get(at).is_some_and(|a| a.addr < end);
        if overlaps_before || overlaps_after {
            return Err(KvError::InvalidArgument(format!(
                "region {:#x}+{} overlaps a registered region",
                region.addr, region.len
            )));
        }
        self.regions.insert(at, *region);
        Ok(true)
    }

    /// Removes the region registered with exactly this (addr, len).
    pub fn remove(&mut self, region: &Region) -> KvResult<Region> {
        match self
            .regions
            .iter()
            .position(|r| r.addr == region.addr && r.len == region.len)
        {
            Some(i) => Ok(self.regions.remove(i)),
            None => Err(KvError::InvalidArgument(format!(
                "region {:#x}+{} is not registered",
                region.addr, region.len
            ))),
        }
    }

    /// The registered region that holds all of `desc`, if any.
    pub fn find(&self, desc: &Desc) -> Option<&Region> {
        let end = desc.addr.checked_add(desc.len)?;
        let at = self.regions.partition_point(|r| r.addr <= desc.addr);
        let r = &self.regions[at.checked_sub(1)?];
        (desc.len > 0 && end <= r.addr + r.len).then_some(r)
    }

    /// The memory kind of a list whose descriptors all lie in registered regions of one kind;
    /// `side` ("local", "remote on agent X") names the side in the error.
    pub fn kind_of(&self, side: &str, descs: &[Desc]) -> KvResult<MemKind> {
        let mut kind = None;
        for (i, d) in descs.iter().enumerate() {
            let r = self.find(d).ok_or_else(|| {
                KvError::InvalidArgument(format!(
                    "{side} descriptor {i} ({:#x}+{}) is not inside one registered region",
                    d.addr, d.len
                ))
            })?;
            match kind {
                None => kind = Some(r.kind),
                Some(k) if k != r.kind => {
                    return Err(KvError::InvalidArgument(format!(
                        "{side} descriptors mix memory kinds ({k:?} and {:?}): one transfer moves \
                         one kind per side",
                        r.kind
                    )))
                }
                Some(_) => {}
            }
        }
        kind.ok_or_else(|| KvError::InvalidArgument(format!("no {side} descriptors")))
    }

    /// Whether `desc` overlaps `region`.
    pub fn overlaps(region: &Region, desc: &Desc) -> bool {
        desc.addr < region.addr.saturating_add(region.len)
            && region.addr < desc.addr.saturating_add(desc.len)
    }
}

const MAGIC: &[u8; 8] = b"KVBXFER1";

/// What a peer's metadata blob says.
#[derive(Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub agent: String,
    pub regions: RegionTable,
    /// The backend's own bytes (NIXL's metadata blob).
    pub payload: Vec<u8>,
}

/// Builds the envelope: magic, backend tag, agent name, regions, payload.
pub fn encode_metadata(tag: &str, agent: &str, regions: &RegionTable, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + regions.regions.len() * 21 + payload.len());
    out.extend_from_slice(MAGIC);
    for s in [tag.as_bytes(), agent.as_bytes()] {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
    }
    out.extend_from_slice(&(regions.regions.len() as u32).to_le_bytes());
    for r in &regions.regions {
        out.extend_from_slice(&r.addr.to_le_bytes());
        out.extend_from_slice(&r.len.to_le_bytes());
        let (kind, device) = match r.kind {
            MemKind::Dram => (0u8, 0i32),
            MemKind::Vram { device } => (1u8, device),
        };
        out.push(kind);
        out.extend_from_slice(&device.to_le_bytes());
    }
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> KvResult<&'a [u8]> {
        if self.rest.len() < n {
            return Err(KvError::InvalidArgument(
                "peer metadata is truncated".into(),
            ));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }
    fn u32(&mut self) -> KvResult<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> KvResult<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn string(&mut self) -> KvResult<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| KvError::InvalidArgument("peer metadata: a name is not UTF-8".into()))
    }
}

/// Parses an envelope built by `encode_metadata` with the same `tag`.
pub fn decode_metadata(tag: &str, blob: &[u8]) -> KvResult<PeerInfo> {
    let mut r = Reader { rest: blob };
    if r.take(MAGIC.len()).ok() != Some(&MAGIC[..]) {
        return Err(KvError::InvalidArgument(
            "not a kvblock transfer metadata blob".into(),
        ));
    }
    let their_tag = r.string()?;
    if their_tag != tag {
        return Err(KvError::InvalidArgument(format!(
            "peer metadata comes from a {their_tag:?} backend, this one is {tag:?}"
        )));
    }
    let agent = r.string()?;
    if agent.is_empty() {
        return Err(KvError::InvalidArgument(
            "peer metadata: empty agent name".into(),
        ));
    }
    let count = r.u32()?;
    let mut regions = RegionTable::default();
    for _ in 0..count {
        let addr = r.u64()?;
        let len = r.u64()?;
        let kind = match r.take(1)?[0] {
            0 => MemKind::Dram,
            1 => MemKind::Vram { device: 0 },
            k => {
                return Err(KvError::InvalidArgument(format!(
                    "peer metadata: unknown memory kind {k}"
                )))
            }
        };
        let device = i32::from_le_bytes(r.take(4)?.try_into().unwrap());
        let kind = match kind {
            MemKind::Vram { .. } => MemKind::Vram { device },
            k => k,
        };
        regions.insert(&Region { addr, len, kind })?;
    }
    let n = usize::try_from(r.u64()?)
        .map_err(|_| KvError::InvalidArgument("peer metadata: payload too large".into()))?;
    let payload = r.take(n)?.to_vec();
    if !r.rest.is_empty() {
        return Err(KvError::InvalidArgument(
            "peer metadata has trailing bytes".into(),
        ));
    }
    Ok(PeerInfo {
        agent,
        regions,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dram(addr: u64, len: u64) -> Region {
        Region {
            addr,
            len,
            kind: MemKind::Dram,
        }
    }

    #[test]
    fn table_is_idempotent_and_refuses_overlaps() {
        let mut t = RegionTable::default();
        assert!(t.insert(&dram(100, 50)).unwrap());
        assert!(!t.insert(&dram(100, 50)).unwrap());
        assert!(t.insert(&dram(0, 100)).unwrap()); // adjacent below
        assert!(t.insert(&dram(150, 10)).unwrap()); // adjacent above
        assert!(t.insert(&dram(120, 10)).is_err());
        assert!(t.insert(&dram(90, 20)).is_err());
        assert!(t.insert(&dram(155, 100)).is_err());
        assert!(t
            .insert(&Region {
                addr: 100,
                len: 50,
                kind: MemKind::Vram { device: 0 }
            })
            .is_err());
        assert!(t.insert(&dram(500, 0)).is_err());
        assert_eq!(t.regions().len(), 3);
        assert_eq!(t.find(&Desc { addr: 100, len: 50 }), Some(&dram(100, 50)));
        assert_eq!(t.find(&Desc { addr: 140, len: 20 }), None); // straddles two regions
        assert_eq!(t.find(&Desc { addr: 160, len: 1 }), None);
        assert_eq!(t.find(&Desc { addr: 0, len: 0 }), None);
        assert!(t.remove(&dram(100, 40)).is_err());
        assert_eq!(t.remove(&dram(100, 50)).unwrap(), dram(100, 50));
        assert_eq!(t.find(&Desc { addr: 100, len: 1 }), None);
    }

    #[test]
    fn kind_of_refuses_mixed_and_unregistered() {
        let mut t = RegionTable::default();
        t.insert(&dram(0, 100)).unwrap();
        t.insert(&Region {
            addr: 1000,
            len: 100,
            kind: MemKind::Vram { device: 3 },
        })
        .unwrap();
        let d = |addr, len| Desc { addr, len };
        assert_eq!(
            t.kind_of("local", &[d(0, 10), d(50, 50)]).unwrap(),
            MemKind::Dram
        );
        assert_eq!(
            t.kind_of("local", &[d(1000, 10)]).unwrap(),
            MemKind::Vram { device: 3 }
        );
        assert!(t.kind_of("local", &[d(0, 10), d(1000, 10)]).is_err());
        assert!(t.kind_of("local", &[d(95, 10)]).is_err());
        assert!(t.kind_of("local", &[]).is_err());
    }

    #[test]
    fn envelope_round_trips_and_refuses_garbage() {
        let mut t = RegionTable::default();
        t.insert(&dram(4096, 8192)).unwrap();
        t.insert(&Region {
            addr: 1 << 40,
            len: 1 << 20,
            kind: MemKind::Vram { device: 2 },
        })
        .unwrap();
        let blob = encode_metadata("nixl", "prefill-0", &t, b"opaque");
        let info = decode_metadata("nixl", &blob).unwrap();
        assert_eq!(info.agent, "prefill-0");
        assert_eq!(info.regions, t);
        assert_eq!(info.payload, b"opaque");
        assert!(decode_metadata("loopback", &blob).is_err());
        for cut in 0..blob.len() {
            assert!(decode_metadata("nixl", &blob[..cut]).is_err());
        }
        let mut longer = blob.clone();
        longer.push(0);
        assert!(decode_metadata("nixl", &longer).is_err());
        assert!(decode_metadata("nixl", b"garbage garbage garbage").is_err());
    }
}
