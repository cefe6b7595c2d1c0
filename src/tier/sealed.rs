//! Sealed blocks: the bytes a tier below host memory stores for one block. A header carries the
//! block's full key, the digest of its whole prefix, the geometry it was written with and a
//! BLAKE3 checksum of the row bytes; the row follows. A read is accepted only when the header,
//! the prefix digest and the checksum all verify, so a torn write, a foreign file or a hash
//! collision is a miss, never KV.

use crate::key::{BlockKeyRef, MmKey};

/// BLAKE3 digest of a block's whole prefix (its key chained onto its parent's digest).
pub type PrefixDigest = [u8; 32];

/// The parent digest of a first block.
pub const ROOT_DIGEST: PrefixDigest = [0; 32];

/// Alignment of slots, headers and I/O buffers (O_DIRECT needs the logical block size).
pub const IO_ALIGN: usize = 4096;

/// Most multimodal keys one stored block may carry (blocks with more are not stored).
pub const MAX_MM_KEYS: usize = 8;

const MAGIC: &[u8; 8] = b"KVBSLOT1";
const VERSION: u32 = 1;
const FIXED: usize = 216;
const CHECKSUM_AT: usize = 184;
const FLAG_EXTRA: u32 = 1;
const FLAG_LORA: u32 = 2;
const FLAG_SALT: u32 = 4;
const MM_BYTES: usize = 36;

/// Rounds `n` up to the I/O alignment.
pub fn align_up(n: usize) -> usize {
    n.div_ceil(IO_ALIGN) * IO_ALIGN
}

/// Bytes of a slot's header for blocks of `tokens_per_block` tokens (room for the largest key).
pub fn slot_header_bytes(tokens_per_block: usize) -> usize {
    FIXED + tokens_per_block * 12 + MAX_MM_KEYS * MM_BYTES
}

/// Bytes of one disk slot: the header and a row of `row_bytes`, aligned as a whole (saturating:
/// the sizing helper takes any caller's figure).
pub fn slot_bytes_for(tokens_per_block: usize, row_bytes: u64) -> u64 {
    let align = IO_ALIGN as u64;
    (slot_header_bytes(tokens_per_block) as u64)
        .saturating_add(row_bytes)
        .div_ceil(align)
        .saturating_mul(align)
}

fn write_key_fields(h: &mut blake3::Hasher, key: &BlockKeyRef<'_>) {
    h.update(&(key.len() as u32).to_le_bytes());
    h.update(&flags_of(key).to_le_bytes());
    h.update(&key.lora_task_id.unwrap_or(0).to_le_bytes());
    h.update(&key.cache_salt.unwrap_or(0).to_le_bytes());
    for t in key.token_ids {
        h.update(&t.to_le_bytes());
    }
    if let Some(extra) = key.extra_ids {
        for e in extra {
            h.update(&e.to_le_bytes());
        }
    }
    h.update(&(key.extra_keys.len() as u32).to_le_bytes());
    for mm in key.extra_keys {
        h.update(&mm.digest);
        h.update(&mm.start_offset.to_le_bytes());
    }
}

fn flags_of(key: &BlockKeyRef<'_>) -> u32 {
    (if key.extra_ids.is_some() {
        FLAG_EXTRA
    } else {
        0
    }) | (if key.lora_task_id.is_some() {
        FLAG_LORA
    } else {
        0
    }) | (if key.cache_salt.is_some() {
        FLAG_SALT
    } else {
        0
    })
}

/// The prefix digest of a block with `key` whose parent's digest is `parent`: stable across
/// processes (it depends on the tokens and key attributes only).
pub fn prefix_digest(parent: &PrefixDigest, key: &BlockKeyRef<'_>) -> PrefixDigest {
    let mut h = blake3::Hasher::new();
    h.update(b"kvblock-prefix-v1");
    h.update(parent);
    write_key_fields(&mut h, key);
    *h.finalize().as_bytes()
}

/// What identifies the pool a slot belongs to: a slot written with another geometry is
/// ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    pub tokens_per_block: usize,
    pub row_bytes: usize,
    /// A digest of the window size and pool geometry.
    pub fingerprint: [u8; 32],
}

impl SlotLayout {
    /// A single pool's layout: its row is the product of its geometry words.
    pub fn new(window_size: usize, tokens_per_block: usize, geometry_words: &[usize]) -> Self {
        let row_bytes = geometry_words.iter().product();
        Self::with_row_bytes(window_size, tokens_per_block, geometry_words, row_bytes)
    }

    /// A layout whose row (every pool's row of a block) has `row_bytes` bytes.
    pub fn with_row_bytes(
        window_size: usize,
        tokens_per_block: usize,
        geometry_words: &[usize],
        row_bytes: usize,
    ) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"kvblock-geometry-v1");
        h.update(&(window_size as u64).to_le_bytes());
        h.update(&(tokens_per_block as u64).to_le_bytes());
        for w in geometry_words {
            h.update(&(*w as u64).to_le_bytes());
        }
        SlotLayout {
            tokens_per_block,
            row_bytes,
            fingerprint: *h.finalize().as_bytes(),
        }
    }

    /// Bytes reserved for the header (the largest key); the row follows it directly.
    pub fn header_bytes(&self) -> usize {
        slot_header_bytes(self.tokens_per_block)
    }

    /// Bytes of one slot: the header and the row, aligned as a whole (a slot is always read
    /// and written whole, so only its start and length must be aligned).
    pub fn slot_bytes(&self) -> usize {
        slot_bytes_for(self.tokens_per_block, self.row_bytes as u64) as usize
    }
}

/// An owned block key decoded from a header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnedKey {
    pub token_ids: Vec<i32>,
    pub extra_ids: Option<Vec<u64>>,
    pub lora_task_id: Option<u64>,
    pub cache_salt: Option<u64>,
    pub extra_keys: Vec<MmKey>,
}

impl OwnedKey {
    pub fn as_ref(&self) -> BlockKeyRef<'_> {
        BlockKeyRef {
            token_ids: &self.token_ids,
            extra_ids: self.extra_ids.as_deref(),
            lora_task_id: self.lora_task_id,
            extra_keys: &self.extra_keys,
            cache_salt: self.cache_salt,
        }
    }
}

/// A verified header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    pub digest: PrefixDigest,
    pub parent: PrefixDigest,
    pub payload_checksum: [u8; 32],
    pub key: OwnedKey,
}

/// Why a slot was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealError {
    /// No header (never written, or not ours).
    NotASlot,
    /// Written for another geometry or window.
    OtherGeometry,
    /// The header, the prefix digest or the row bytes do not verify.
    Corrupt,
    /// A valid slot of another block.
    OtherKey,
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

fn digest_at(buf: &[u8], at: usize) -> [u8; 32] {
    buf[at..at + 32].try_into().expect("32 bytes")
}

/// Whether `key` fits in a header of `layout` (tokens within the block, few multimodal keys).
pub fn fits(layout: &SlotLayout, key: &BlockKeyRef<'_>) -> bool {
    key.len() <= layout.tokens_per_block && key.extra_keys.len() <= MAX_MM_KEYS
}

/// Writes the header of a slot into `slot[..header_bytes]` and checksums it; the row must
/// already be in `slot[header_bytes..header_bytes + row_bytes]`. Returns the block's prefix
/// digest. (`seal_key` then `seal_checksums` do the same in two steps.)
pub fn seal(
    layout: &SlotLayout,
    slot: &mut [u8],
    parent: &PrefixDigest,
    key: &BlockKeyRef<'_>,
) -> PrefixDigest {
    let digest = seal_key(layout, slot, parent, key);
    seal_checksums(layout, slot);
    digest
}

/// Checksums a slot whose key was written by `seal_key`: the row's BLAKE3, then the header's.
/// The costly half of sealing, run on an I/O worker.
pub fn seal_checksums(layout: &SlotLayout, slot: &mut [u8]) {
    let hb = layout.header_bytes();
    let checksum = *blake3::hash(&slot[hb..hb + layout.row_bytes]).as_bytes();
    put(slot, 112, &checksum);
    let used = u32_at(slot, 12) as usize;
    put(slot, CHECKSUM_AT, &[0; 32]);
    let sum = *blake3::hash(&slot[..used]).as_bytes();
    put(slot, CHECKSUM_AT, &sum);
}

/// Writes a slot's header fields and key (no checksums yet, see `seal_checksums`). Returns the
/// block's prefix digest.
pub fn seal_key(
    layout: &SlotLayout,
    slot: &mut [u8],
    parent: &PrefixDigest,
    key: &BlockKeyRef<'_>,
) -> PrefixDigest {
    debug_assert!(fits(layout, key));
    let hb = layout.header_bytes();
    let digest = prefix_digest(parent, key);
    let header = &mut slot[..hb];
    header.fill(0);
    put(header, 0, MAGIC);
    put(header, 8, &VERSION.to_le_bytes());
    put(header, 16, &layout.fingerprint);
    put(header, 48, &digest);
    put(header, 80, parent);
    put(header, 144, &(layout.row_bytes as u64).to_le_bytes());
    put(header, 152, &(key.len() as u32).to_le_bytes());
    put(header, 156, &flags_of(key).to_le_bytes());
    put(header, 160, &key.lora_task_id.unwrap_or(0).to_le_bytes());
    put(header, 168, &key.cache_salt.unwrap_or(0).to_le_bytes());
    put(header, 176, &(key.extra_keys.len() as u32).to_le_bytes());
    let mut at = FIXED;
    for t in key.token_ids {
        put(header, at, &t.to_le_bytes());
        at += 4;
    }
    if let Some(extra) = key.extra_ids {
        for e in extra {
            put(header, at, &e.to_le_bytes());
            at += 8;
        }
    }
    for mm in key.extra_keys {
        put(header, at, &mm.digest);
        put(header, at + 32, &mm.start_offset.to_le_bytes());
        at += MM_BYTES;
    }
    put(header, 12, &(at as u32).to_le_bytes());
    digest
}

/// Decodes and checks a header (its own checksum, the geometry, the prefix digest against the
/// key it carries). The row's checksum is checked by `verify_slot`.
pub fn open_header(layout: &SlotLayout, header: &[u8]) -> Result<SlotHeader, SealError> {
    let hb = layout.header_bytes();
    if header.len() < hb || &header[..8] != MAGIC || u32_at(header, 8) != VERSION {
        return Err(SealError::NotASlot);
    }
    let used = u32_at(header, 12) as usize;
    if !(FIXED..=hb).contains(&used) {
        return Err(SealError::Corrupt);
    }
    let stored_sum = digest_at(header, CHECKSUM_AT);
    let mut zeroed = header[..used].to_vec();
    zeroed[CHECKSUM_AT..CHECKSUM_AT + 32].copy_from_slice(&[0; 32]);
    // The checksum was computed with its own field still zero.
    if *blake3::hash(&zeroed).as_bytes() != stored_sum {
        return Err(SealError::Corrupt);
    }
    if digest_at(header, 16) != layout.fingerprint || u64_at(header, 144) != layout.row_bytes as u64
    {
        return Err(SealError::OtherGeometry);
    }
    let len = u32_at(header, 152) as usize;
    let flags = u32_at(header, 156);
    let mm = u32_at(header, 176) as usize;
    let extra = flags & FLAG_EXTRA != 0;
    let need = FIXED + len * 4 + if extra { len * 8 } else { 0 } + mm * MM_BYTES;
    if len > layout.tokens_per_block || mm > MAX_MM_KEYS || need != used {
        return Err(SealError::Corrupt);
    }
    let mut at = FIXED;
    let token_ids = (0..len)
        .map(|i| u32_at(header, at + 4 * i) as i32)
        .collect();
    at += 4 * len;
    let extra_ids = extra.then(|| {
        let v = (0..len).map(|i| u64_at(header, at + 8 * i)).collect();
        at += 8 * len;
        v
    });
    let extra_keys = (0..mm)
        .map(|i| {
            let o = at + i * MM_BYTES;
            MmKey {
                digest: digest_at(header, o),
                start_offset: u32_at(header, o + 32) as i32,
            }
        })
        .collect();
    let key = OwnedKey {
        token_ids,
        extra_ids,
        lora_task_id: (flags & FLAG_LORA != 0).then(|| u64_at(header, 160)),
        cache_salt: (flags & FLAG_SALT != 0).then(|| u64_at(header, 168)),
        extra_keys,
    };
    let parent = digest_at(header, 80);
    let digest = digest_at(header, 48);
    if prefix_digest(&parent, &key.as_ref()) != digest {
        return Err(SealError::Corrupt);
    }
    Ok(SlotHeader {
        digest,
        parent,
        payload_checksum: digest_at(header, 112),
        key,
    })
}

/// Verifies a whole slot read back for the block whose prefix digest is `expected`.
pub fn verify_slot(
    layout: &SlotLayout,
    slot: &[u8],
    expected: &PrefixDigest,
) -> Result<SlotHeader, SealError> {
    let header = open_header(layout, slot)?;
    if &header.digest != expected {
        return Err(SealError::OtherKey);
    }
    let hb = layout.header_bytes();
    if *blake3::hash(&slot[hb..hb + layout.row_bytes]).as_bytes() != header.payload_checksum {
        return Err(SealError::Corrupt);
    }
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> SlotLayout {
        SlotLayout::new(64, 4, &[2, 2, 1, 4, 4, 2])
    }

    fn sealed(key: &BlockKeyRef<'_>) -> (Vec<u8>, PrefixDigest) {
        let l = layout();
        let mut slot = vec![0u8; l.slot_bytes()];
        let hb = l.header_bytes();
        for (i, b) in slot[hb..hb + l.row_bytes].iter_mut().enumerate() {
            *b = i as u8;
        }
        let d = seal(&l, &mut slot, &ROOT_DIGEST, key);
        (slot, d)
    }

    #[test]
    fn a_sealed_slot_verifies_and_carries_its_key() {
        let extra = [7u64, 8, 9];
        let mm = [MmKey {
            digest: [3; 32],
            start_offset: -1,
        }];
        let key = BlockKeyRef {
            token_ids: &[1, 2, 3],
            extra_ids: Some(&extra),
            lora_task_id: Some(5),
            extra_keys: &mm,
            cache_salt: Some(11),
        };
        let (slot, d) = sealed(&key);
        let h = verify_slot(&layout(), &slot, &d).unwrap();
        assert!(h.key.as_ref().equals(&key));
        assert_eq!(h.parent, ROOT_DIGEST);
    }

    #[test]
    fn flips_other_keys_and_geometries_are_refused() {
        let key = BlockKeyRef::plain(&[1, 2, 3, 4]);
        let (mut slot, d) = sealed(&key);
        let other = prefix_digest(&ROOT_DIGEST, &BlockKeyRef::plain(&[1, 2, 3, 5]));
        assert_eq!(
            verify_slot(&layout(), &slot, &other),
            Err(SealError::OtherKey)
        );
        let foreign = SlotLayout::new(128, 4, &[2, 2, 1, 4, 4, 2]);
        assert_eq!(
            verify_slot(&foreign, &slot, &d),
            Err(SealError::OtherGeometry)
        );
        let hb = layout().header_bytes();
        slot[hb + 3] ^= 1;
        assert_eq!(verify_slot(&layout(), &slot, &d), Err(SealError::Corrupt));
        slot[hb + 3] ^= 1;
        slot[FIXED + 1] ^= 0x10;
        assert_eq!(verify_slot(&layout(), &slot, &d), Err(SealError::Corrupt));
        assert_eq!(
            verify_slot(&layout(), &vec![0u8; slot.len()], &d),
            Err(SealError::NotASlot)
        );
    }

    #[test]
    fn prefix_digests_chain() {
        let a = prefix_digest(&ROOT_DIGEST, &BlockKeyRef::plain(&[1, 2]));
        let b1 = prefix_digest(&a, &BlockKeyRef::plain(&[3, 4]));
        let b2 = prefix_digest(&ROOT_DIGEST, &BlockKeyRef::plain(&[3, 4]));
        assert_ne!(b1, b2);
    }
}
