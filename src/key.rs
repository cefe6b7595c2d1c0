//! Tokens, block keys, multimodal extra keys and the chained block hash.
//!
//! The hash is bit-exact with TensorRT-LLM V1's `BlockKeyHasher` formula so that event
//! consumers keyed on TensorRT-LLM hashes keep working. Lookups never rely on the hash alone: the
//! reuse tree always compares full keys.

/// Multiplier of the 64-bit finaliser (splitmix64 / Stafford variant 13).
const C1: u64 = 0xbf58_476d_1ce4_e5b9;
const C2: u64 = 0x94d0_49bb_1331_11eb;
/// Golden-ratio constant of the boost-style `hash_combine`.
const GOLDEN: u32 = 0x9e37_79b9;

/// One multimodal item of a request: a 32-byte content digest covering `length` prompt tokens
/// starting at `position`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MultimodalItem {
    pub digest: [u8; 32],
    pub position: i32,
    pub length: i32,
}

/// A multimodal item's contribution to one block's key: the digest and where the item starts
/// relative to the block (0 when the item starts inside the block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmKey {
    pub digest: [u8; 32],
    pub start_offset: i32,
}

/// A borrowed block key: the tokens of one block plus everything that partitions reuse.
#[derive(Clone, Copy, Debug)]
pub struct BlockKeyRef<'a> {
    pub token_ids: &'a [i32],
    /// Per-token extra ids (prompt-tuning virtual tokens); `None` when the request has none.
    pub extra_ids: Option<&'a [u64]>,
    pub lora_task_id: Option<u64>,
    pub extra_keys: &'a [MmKey],
    pub cache_salt: Option<u64>,
}

impl<'a> BlockKeyRef<'a> {
    /// A key of plain tokens without LoRA, salt or multimodal items.
    pub fn plain(token_ids: &'a [i32]) -> Self {
        BlockKeyRef {
            token_ids,
            extra_ids: None,
            lora_task_id: None,
            extra_keys: &[],
            cache_salt: None,
        }
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    fn extra_id(&self, i: usize) -> u64 {
        self.extra_ids.map_or(0, |e| e[i])
    }

    /// Full equality of all five key fields (TensorRT-LLM `BlockKey::operator==`).
    pub fn equals(&self, other: &BlockKeyRef<'_>) -> bool {
        self.extra_ids.is_some() == other.extra_ids.is_some()
            && self.lora_task_id == other.lora_task_id
            && self.cache_salt == other.cache_salt
            && self.extra_keys == other.extra_keys
            && self.token_ids == other.token_ids
            && match (self.extra_ids, other.extra_ids) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// Length of the common token prefix when LoRA id, multimodal keys and salt are equal,
    /// otherwise 0 (TensorRT-LLM `numMatchingTokens`; `usesExtraIds` is not compared, missing
    /// extra ids count as 0).
    pub fn common_prefix_len(&self, other: &BlockKeyRef<'_>) -> usize {
        if self.lora_task_id != other.lora_task_id
            || self.cache_salt != other.cache_salt
            || self.extra_keys != other.extra_keys
        {
            return 0;
        }
        let n = self.token_ids.len().min(other.token_ids.len());
        (0..n)
            .find(|&i| {
                self.token_ids[i] != other.token_ids[i] || self.extra_id(i) != other.extra_id(i)
            })
            .unwrap_or(n)
    }
}

fn mix32(mut x: u32) -> u32 {
    x = ((x >> 16) ^ x).wrapping_mul(0x045d_9f3b);
    x = ((x >> 16) ^ x).wrapping_mul(0x045d_9f3b);
    (x >> 16) ^ x
}

fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(C1);
    x = (x ^ (x >> 27)).wrapping_mul(C2);
    x ^ (x >> 31)
}

/// `hash_combine` of a 32-bit value: `v + G` wraps at 2^32 before widening, as in C++.
fn combine32(seed: u64, v: u32) -> u64 {
    let term = u64::from(v.wrapping_add(GOLDEN));
    seed ^ term.wrapping_add(seed << 6).wrapping_add(seed >> 2)
}

fn combine64(seed: u64, v: u64) -> u64 {
    seed ^ v
        .wrapping_add(u64::from(GOLDEN))
        .wrapping_add(seed << 6)
        .wrapping_add(seed >> 2)
}

/// TensorRT-LLM V1 block hash of `key` chained onto `parent_hash` (0 for the root).
pub fn block_hash(key: &BlockKeyRef<'_>, parent_hash: u64) -> u64 {
    let mut seed = (key.token_ids.len() as u64) ^ parent_hash.wrapping_mul(C1);
    if parent_hash == 0 {
        if let Some(salt) = key.cache_salt {
            seed = combine64(seed, mix64(salt));
        }
    }
    for (i, &token) in key.token_ids.iter().enumerate() {
        seed = combine32(seed, mix32(token as u32));
        if let Some(extra) = key.extra_ids {
            seed = combine64(seed, mix64(extra[i]));
        }
    }
    if let Some(lora) = key.lora_task_id {
        seed = combine64(seed, mix64(lora));
    }
    for mm in key.extra_keys {
        for word in mm.digest.chunks_exact(4) {
            let w = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            seed = combine32(seed, mix32(w));
        }
        seed = combine64(seed, mix64(mm.start_offset as i64 as u64));
    }
    seed
}

/// A fast 64-bit hash of one block's key alone (not chained), used only to index the reuse
/// tree's children: lookups walk from a known parent, so the parent's id already disambiguates
/// the prefix. Four independent multiply-xor lanes keep it short; it is never exposed.
pub fn lookup_hash(key: &BlockKeyRef<'_>) -> u64 {
    const M: [u64; 4] = [
        0x9e37_79b9_7f4a_7c15,
        0xc2b2_ae3d_27d4_eb4f,
        0x1656_67b1_9e37_79f9,
        0xd6e8_feb8_6659_fd93,
    ];
    #[inline(always)]
    fn pair(a: i32, b: i32) -> u64 {
        u64::from(a as u32) | (u64::from(b as u32) << 32)
    }
    #[inline(always)]
    fn step(lane: u64, w: u64, m: u64) -> u64 {
        (lane ^ w).wrapping_mul(m).rotate_left(31)
    }
    let mut lanes = [key.token_ids.len() as u64, M[1], M[2], M[3]];
    // A slice pattern per 8 tokens: no bounds checks or iterator state in the loop.
    let mut rest = key.token_ids;
    while let [t0, t1, t2, t3, t4, t5, t6, t7, tail @ ..] = rest {
        lanes[0] = step(lanes[0], pair(*t0, *t1), M[0]);
        lanes[1] = step(lanes[1], pair(*t2, *t3), M[1]);
        lanes[2] = step(lanes[2], pair(*t4, *t5), M[2]);
        lanes[3] = step(lanes[3], pair(*t6, *t7), M[3]);
        rest = tail;
    }
    if !rest.is_empty() {
        // The last 1..7 tokens, zero-padded (the length in lane 0 tells the padding apart).
        let mut last = [0i32; 8];
        last[..rest.len()].copy_from_slice(rest);
        lanes[0] = step(lanes[0], pair(last[0], last[1]), M[0]);
        lanes[1] = step(lanes[1], pair(last[2], last[3]), M[1]);
        lanes[2] = step(lanes[2], pair(last[4], last[5]), M[2]);
        lanes[3] = step(lanes[3], pair(last[6], last[7]), M[3]);
    }
    let mut h =
        lanes[0] ^ lanes[1].rotate_left(17) ^ lanes[2].rotate_left(34) ^ lanes[3].rotate_left(51);
    if let Some(extra) = key.extra_ids {
        for &e in extra {
            h = (h ^ e).wrapping_mul(M[1]).rotate_left(29);
        }
    }
    // Each attribute mixed with its own constant, and only when present.
    if let Some(lora) = key.lora_task_id {
        h = (h ^ lora ^ 0x5bd1_e995).wrapping_mul(M[2]);
    }
    if let Some(salt) = key.cache_salt {
        h = (h ^ salt ^ 0x2545_f491_4f6c_dd1d)
            .wrapping_mul(M[3])
            .rotate_left(19);
    }
    for mm in key.extra_keys {
        for chunk in mm.digest.chunks_exact(8) {
            let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            h = (h ^ w).wrapping_mul(M[3]).rotate_left(23);
        }
        h = (h ^ mm.start_offset as u64).wrapping_mul(M[0]);
    }
    mix64(h)
}

/// The multimodal keys of the block covering prompt tokens `[start, end)`: every item that
/// overlaps the range contributes its digest with offset 0 if it starts inside the block, else
/// `start - position`.
pub fn multimodal_keys_for_range(
    items: &[MultimodalItem],
    start: i32,
    end: i32,
    out: &mut Vec<MmKey>,
) {
    out.clear();
    for item in items {
        // Widened: an item reaching past i32::MAX still covers the block (never dropped).
        let item_end = i64::from(item.position) + i64::from(item.length);
        if item.position < end && item_end > i64::from(start) {
            let start_offset = if item.position >= start {
                0
            } else {
                start - item.position
            };
            out.push(MmKey {
                digest: item.digest,
                start_offset,
            });
        }
    }
}

/// The 32-byte content digest of one multimodal item (an image, an audio clip, ...): BLAKE3 of
/// its raw bytes. Items whose placeholder token ids are equal but whose content differs get
/// different digests, so their blocks never match in the reuse tree; the same bytes give the
/// same digest in every process and on every run (BLAKE3 is unkeyed and fully specified).
pub fn multimodal_digest(content: &[u8]) -> [u8; 32] {
    *blake3::hash(content).as_bytes()
}

/// Expands TensorRT-LLM's representation of a multimodal digest (8 × int32, each written
/// big-endian) into the 32-byte digest used by keys.
pub fn digest_from_i32_words(words: &[i32; 8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, w) in words.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values were worked out from TensorRT-LLM's `BlockKeyHasher` formula with an
    // independent arbitrary-precision implementation (explicit 32/64-bit masks), not from this
    // code.

    #[test]
    fn mixers_match_worked_values() {
        assert_eq!(mix32(0), 0);
        assert_eq!(mix32(1), 0x3125_1ba7);
        assert_eq!(mix32(0xdead_beef), 0x5353_e2e9);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
    }

    #[test]
    fn combine32_wraps_before_widening() {
        // mix32(2) + G overflows 32 bits: the carry must be dropped.
        assert_eq!(mix32(2), 0x66a7_9298);
        let key = BlockKeyRef::plain(&[2]);
        assert_eq!(block_hash(&key, 0), 0x04df_0c90);
        assert_ne!(block_hash(&key, 0), 0x1_04df_0c90);
    }

    #[test]
    fn plain_chain_hashes() {
        let first = block_hash(&BlockKeyRef::plain(&[0, 1, 2, 3]), 0);
        assert_eq!(first, 0x0002_9afb_f4c4_4315);
        let child = block_hash(&BlockKeyRef::plain(&[4, 5, 6, 7]), first);
        assert_eq!(child, 0x5794_d533_64db_ae2a);
        assert_eq!(
            block_hash(&BlockKeyRef::plain(&[-1, i32::MAX]), 0),
            0x30_9a78_d533
        );
        assert_eq!(block_hash(&BlockKeyRef::plain(&[]), 0), 0);
    }

    #[test]
    fn extra_ids_lora_salt_and_multimodal_change_the_hash() {
        let tokens = [1, 2];
        let mut key = BlockKeyRef::plain(&tokens);
        key.extra_ids = Some(&[7, 0]);
        assert_eq!(block_hash(&key, 0), 0x6d93_74f7_5aef_6185);

        let mut key = BlockKeyRef::plain(&tokens);
        key.lora_task_id = Some(42);
        assert_eq!(block_hash(&key, 0), 0xa759_f751_041c_952e);

        let mut key = BlockKeyRef::plain(&tokens);
        key.cache_salt = Some(99);
        assert_eq!(block_hash(&key, 0), 0xc783_35a8_5663_c2d5);
        // The salt is only mixed into first blocks; descendants inherit it through the chain.
        assert_eq!(
            block_hash(&key, 123),
            block_hash(&BlockKeyRef::plain(&tokens), 123)
        );
        assert_eq!(block_hash(&key, 123), 0x8674_5320_66a9_7356);

        let mut digest = [0u8; 32];
        for (i, b) in digest.iter_mut().enumerate() {
            *b = i as u8;
        }
        let mm = [MmKey {
            digest,
            start_offset: 3,
        }];
        let mut key = BlockKeyRef::plain(&tokens);
        key.extra_keys = &mm;
        assert_eq!(block_hash(&key, 0), 0xcd15_758f_8a82_75aa);
    }

    #[test]
    fn key_equality_and_partial_match() {
        let a = BlockKeyRef::plain(&[1, 2, 3, 4]);
        let b = BlockKeyRef::plain(&[1, 2, 9, 4]);
        assert!(a.equals(&a));
        assert!(!a.equals(&b));
        assert_eq!(a.common_prefix_len(&b), 2);
        let mut lora = a;
        lora.lora_task_id = Some(0);
        assert!(!a.equals(&lora), "no LoRA differs from LoRA 0");
        assert_eq!(a.common_prefix_len(&lora), 0);
        let extras = [0u64, 0, 5, 0];
        let mut with_extras = a;
        with_extras.extra_ids = Some(&extras);
        assert!(!a.equals(&with_extras), "usesExtraIds is part of equality");
        assert_eq!(a.common_prefix_len(&with_extras), 2);
    }

    #[test]
    fn multimodal_keys_cover_overlapping_blocks() {
        let item = MultimodalItem {
            digest: [7; 32],
            position: 2,
            length: 5,
        };
        let mut out = Vec::new();
        multimodal_keys_for_range(&[item], 0, 4, &mut out);
        assert_eq!(
            out,
            vec![MmKey {
                digest: [7; 32],
                start_offset: 0
            }]
        );
        multimodal_keys_for_range(&[item], 4, 8, &mut out);
        assert_eq!(
            out,
            vec![MmKey {
                digest: [7; 32],
                start_offset: 2
            }]
        );
        multimodal_keys_for_range(&[item], 8, 12, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn lookup_hash_separates_what_keys_separate() {
        let a = BlockKeyRef::plain(&[1, 2, 3, 4]);
        let b = BlockKeyRef::plain(&[1, 2, 4, 3]);
        let short = BlockKeyRef::plain(&[1, 2, 3]);
        assert_ne!(lookup_hash(&a), lookup_hash(&b));
        assert_ne!(lookup_hash(&a), lookup_hash(&short));
        let mut lora = a;
        lora.lora_task_id = Some(0);
        assert_ne!(lookup_hash(&a), lookup_hash(&lora));
        let mut salted = a;
        salted.cache_salt = Some(0);
        assert_ne!(lookup_hash(&lora), lookup_hash(&salted));
        assert_eq!(
            lookup_hash(&a),
            lookup_hash(&BlockKeyRef::plain(&[1, 2, 3, 4]))
        );
    }

    fn hex(d: &[u8; 32]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn multimodal_digest_matches_blake3_known_answers() {
        // Fixed digests (BLAKE3 is unkeyed; they agree with BLAKE3's standard test values and
        // the Python blake3 package): the empty input,
        assert_eq!(
            hex(&multimodal_digest(&[])),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        // "abc",
        assert_eq!(
            hex(&multimodal_digest(b"abc")),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        // and 1025 bytes of the pattern 0, 1, ..., 250, 0, 1, ...:
        // it crosses the 1024-byte chunk boundary, so the tree mode is covered too.
        let input: Vec<u8> = (0..1025).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            hex(&multimodal_digest(&input)),
            "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"
        );
        assert_ne!(multimodal_digest(b"abc"), multimodal_digest(b"abd"));
    }

    #[test]
    fn digest_words_are_big_endian() {
        let mut words = [0i32; 8];
        words[0] = 0x0102_0304;
        let d = digest_from_i32_words(&words);
        assert_eq!(&d[0..4], &[1, 2, 3, 4]);
    }
}
