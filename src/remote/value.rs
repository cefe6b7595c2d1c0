//! Keys and values of the remote tier. A key is the namespace (the model identity the engine
//! gives, the window size, tokens per block, the row geometry and element size) and the
//! block's prefix digest (BLAKE3 over its whole chain of keys, cache salt included). A value is
//! a sealed block (`tier::sealed`: format version, the namespace's fingerprint, the full block
//! key, its parent's digest and a BLAKE3 checksum of the row) followed by the row. Values read
//! back are untrusted: anything that does not verify is refused with its reason, never used.

use crate::key::BlockKeyRef;
use crate::tier::sealed::{seal, verify_slot, PrefixDigest, SealError, SlotHeader, SlotLayout};

/// Why a value read from the store was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not the length of a value of this namespace (truncated, padded, another geometry).
    WrongLength,
    /// No header of ours (garbage, another program's value).
    NotAValue,
    /// A value of another namespace (model, geometry or window).
    OtherNamespace,
    /// The header, the prefix digest or the row checksum does not verify.
    Corrupt,
    /// A valid value of another block (the key collided or the value was moved).
    OtherKey,
}

/// The namespace of one window's blocks in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    layout: SlotLayout,
    prefix: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Namespace {
    /// `model` identifies the model's weights (what makes two engines' KV interchangeable:
    /// name, revision, quantisation, tensor-parallel rank...); `window` is the slot layout of
    /// the window's pool (window size, tokens per block, geometry, element size).
    pub fn new(model: &str, window: &SlotLayout) -> Namespace {
        let mut h = blake3::Hasher::new();
        h.update(b"kvblock-remote-namespace-v1");
        h.update(&(model.len() as u64).to_le_bytes());
        h.update(model.as_bytes());
        h.update(&window.fingerprint);
        let fingerprint = *h.finalize().as_bytes();
        Namespace {
            layout: SlotLayout {
                tokens_per_block: window.tokens_per_block,
                row_bytes: window.row_bytes,
                fingerprint,
            },
            prefix: format!("kvb:v1:{}:", hex(&fingerprint[..12])),
        }
    }

    pub fn layout(&self) -> &SlotLayout {
        &self.layout
    }

    /// The store key of the block with this prefix digest.
    pub fn key(&self, digest: &PrefixDigest) -> Vec<u8> {
        let mut k = self.prefix.clone().into_bytes();
        k.extend_from_slice(hex(digest).as_bytes());
        k
    }

    /// Bytes of every value: the header, then the row (no padding after it).
    pub fn value_len(&self) -> usize {
        self.layout.header_bytes() + self.layout.row_bytes
    }

    /// Seals `row` as the value of the block `key` whose parent's digest is `parent`. Returns
    /// the block's digest and the value.
    pub fn encode(
        &self,
        parent: &PrefixDigest,
        key: &BlockKeyRef<'_>,
        row: &[u8],
    ) -> (PrefixDigest, Vec<u8>) {
        let mut v = self.new_value();
        self.row_mut(&mut v)
            .copy_from_slice(&row[..self.layout.row_bytes]);
        let d = self.seal(&mut v, parent, key);
        (d, v)
    }

    /// A value buffer whose row part (`row_mut`) the caller fills before `seal`.
    pub fn new_value(&self) -> Vec<u8> {
        vec![0u8; self.value_len()]
    }

    /// The row part of a value buffer.
    pub fn row_mut<'v>(&self, value: &'v mut [u8]) -> &'v mut [u8] {
        &mut value[self.layout.header_bytes()..]
    }

    /// Seals a value buffer whose row is in place (no copy). Returns the block's digest.
    pub fn seal(
        &self,
        value: &mut [u8],
        parent: &PrefixDigest,
        key: &BlockKeyRef<'_>,
    ) -> PrefixDigest {
        seal(&self.layout, value, parent, key)
    }

    /// Checks a value read back for the block `expected`.
    pub fn verify(&self, value: &[u8], expected: &PrefixDigest) -> Result<SlotHeader, Refusal> {
        if value.len() != self.value_len() {
            return Err(Refusal::WrongLength);
        }
        verify_slot(&self.layout, value, expected).map_err(|e| match e {
            SealError::NotASlot => Refusal::NotAValue,
            SealError::OtherGeometry => Refusal::OtherNamespace,
            SealError::Corrupt => Refusal::Corrupt,
            SealError::OtherKey => Refusal::OtherKey,
        })
    }

    /// The row of a verified value.
    pub fn row<'v>(&self, value: &'v [u8]) -> &'v [u8] {
        &value[self.layout.header_bytes()..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::sealed::{prefix_digest, ROOT_DIGEST};

    fn ns(model: &str) -> Namespace {
        Namespace::new(model, &SlotLayout::new(64, 4, &[2, 2, 1, 4, 4, 2]))
    }

    #[test]
    fn values_verify_and_every_kind_of_bad_value_is_refused() {
        let n = ns("m");
        let row: Vec<u8> = (0..n.layout().row_bytes).map(|i| i as u8).collect();
        let key = BlockKeyRef::plain(&[1, 2, 3, 4]);
        let (d, v) = n.encode(&ROOT_DIGEST, &key, &row);
        assert_eq!(d, prefix_digest(&ROOT_DIGEST, &key));
        let h = n.verify(&v, &d).unwrap();
        assert!(h.key.as_ref().equals(&key));
        assert_eq!(n.row(&v), &row[..]);
        assert_eq!(n.verify(&v[..v.len() - 1], &d), Err(Refusal::WrongLength));
        assert_eq!(n.verify(b"garbage", &d), Err(Refusal::WrongLength));
        assert_eq!(n.verify(&vec![7u8; v.len()], &d), Err(Refusal::NotAValue));
        let (_, other_model) = ns("other").encode(&ROOT_DIGEST, &key, &row);
        assert_eq!(n.verify(&other_model, &d), Err(Refusal::OtherNamespace));
        let other = prefix_digest(&ROOT_DIGEST, &BlockKeyRef::plain(&[9, 9, 9, 9]));
        assert_eq!(n.verify(&v, &other), Err(Refusal::OtherKey));
        let mut flipped = v.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(n.verify(&flipped, &d), Err(Refusal::Corrupt));
        assert_ne!(n.key(&d), ns("other").key(&d));
    }
}
