//! msgpack encoding of a batch in the vLLM / Dynamo schema: `[ts, [events], dp_rank]`, each event
//! a map tagged by `"type"` with every key of its struct present (nil where unknown).

use rmp::encode;

use super::filter::WireEvent;

/// `medium` of the reuse tree's blocks (GPU or host memory, which the manager onboards at
/// admission): vLLM's `MEDIUM_GPU`, which Dynamo's indexer maps to its device tier.
pub const MEDIUM: &str = "GPU";

/// `medium` of the disk tier's blocks (published only when asked): the name Dynamo's indexer
/// maps to its disk tier. vLLM's own names for its file-system tiers ("FS", "STORAGE") are not
/// used: Dynamo does not know them and would take such blocks for GPU blocks.
pub const MEDIUM_DISK: &str = "DISK";

fn put_str(buf: &mut Vec<u8>, s: &str) {
    // Writing into a Vec<u8> cannot fail.
    encode::write_str(buf, s).expect("write to Vec");
}

fn put_key_str(buf: &mut Vec<u8>, key: &str, value: &str) {
    put_str(buf, key);
    put_str(buf, value);
}

fn put_opt_u64(buf: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => drop(encode::write_uint(buf, v).expect("write to Vec")),
        None => encode::write_nil(buf).expect("write to Vec"),
    }
}

fn put_u64s(buf: &mut Vec<u8>, key: &str, values: &[u64]) {
    put_str(buf, key);
    encode::write_array_len(buf, values.len() as u32).expect("write to Vec");
    for &v in values {
        encode::write_uint(buf, v).expect("write to Vec");
    }
}

fn put_event(buf: &mut Vec<u8>, e: &WireEvent) {
    match e {
        WireEvent::Stored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            medium,
        } => {
            encode::write_map_len(buf, 8).expect("write to Vec");
            put_key_str(buf, "type", "BlockStored");
            put_u64s(buf, "block_hashes", block_hashes);
            put_str(buf, "parent_block_hash");
            put_opt_u64(buf, *parent_block_hash);
            put_str(buf, "token_ids");
            encode::write_array_len(buf, token_ids.len() as u32).expect("write to Vec");
            for &t in token_ids {
                encode::write_sint(buf, i64::from(t)).expect("write to Vec");
            }
            put_str(buf, "block_size");
            encode::write_uint(buf, *block_size as u64).expect("write to Vec");
            put_str(buf, "lora_id");
            put_opt_u64(buf, *lora_id);
            put_key_str(buf, "medium", medium);
            put_str(buf, "lora_name");
            encode::write_nil(buf).expect("write to Vec");
        }
        WireEvent::Removed {
            block_hashes,
            medium,
        } => {
            encode::write_map_len(buf, 3).expect("write to Vec");
            put_key_str(buf, "type", "BlockRemoved");
            put_u64s(buf, "block_hashes", block_hashes);
            put_key_str(buf, "medium", medium);
        }
        WireEvent::AllBlocksCleared => {
            encode::write_map_len(buf, 1).expect("write to Vec");
            put_key_str(buf, "type", "AllBlocksCleared");
        }
    }
}

/// The msgpack payload of one batch.
pub fn encode_batch(ts: f64, events: &[WireEvent], dp_rank: Option<i32>) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64 + events.len() * 64);
    encode::write_array_len(&mut buf, 3).expect("write to Vec");
    encode::write_f64(&mut buf, ts).expect("write to Vec");
    encode::write_array_len(&mut buf, events.len() as u32).expect("write to Vec");
    for e in events {
        put_event(&mut buf, e);
    }
    match dp_rank {
        Some(r) => drop(encode::write_sint(&mut buf, i64::from(r)).expect("write to Vec")),
        None => encode::write_nil(&mut buf).expect("write to Vec"),
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_batch_bytes() {
        let b = encode_batch(
            0.5,
            &[WireEvent::Removed {
                block_hashes: vec![u64::MAX],
                medium: MEDIUM,
            }],
            None,
        );
        let mut want = vec![0x93, 0xcb];
        want.extend_from_slice(&0.5f64.to_be_bytes());
        want.extend_from_slice(&[0x91, 0x83, 0xa4]);
        want.extend_from_slice(b"type");
        want.push(0xac);
        want.extend_from_slice(b"BlockRemoved");
        want.push(0xac);
        want.extend_from_slice(b"block_hashes");
        want.extend_from_slice(&[0x91, 0xcf]);
        want.extend_from_slice(&u64::MAX.to_be_bytes());
        want.push(0xa6);
        want.extend_from_slice(b"medium");
        want.push(0xa3);
        want.extend_from_slice(b"GPU");
        want.push(0xc0);
        assert_eq!(b, want);
    }

    #[test]
    fn stored_has_every_key_and_dp_rank_is_an_int() {
        let b = encode_batch(
            1.0,
            &[
                WireEvent::Stored {
                    block_hashes: vec![1],
                    parent_block_hash: None,
                    token_ids: vec![-1, 2],
                    block_size: 2,
                    lora_id: Some(3),
                    medium: MEDIUM,
                },
                WireEvent::AllBlocksCleared,
            ],
            Some(2),
        );
        let text = String::from_utf8_lossy(&b);
        for key in [
            "BlockStored",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
            "AllBlocksCleared",
        ] {
            assert!(text.contains(key), "{key} missing");
        }
        assert_eq!(b[0..2], [0x93, 0xcb]);
        assert_eq!(b[b.len() - 1], 0x02);
        // The Stored map has 8 entries, AllBlocksCleared 1.
        assert_eq!(b[11], 0x88);
        assert!(b.windows(2).any(|w| w == [0x81, 0xa4]));
    }

    #[test]
    fn disk_medium_is_encoded() {
        let b = encode_batch(
            0.0,
            &[WireEvent::Removed {
                block_hashes: vec![1],
                medium: MEDIUM_DISK,
            }],
            None,
        );
        let mut tail = vec![0xa6];
        tail.extend_from_slice(b"medium");
        tail.push(0xa4);
        tail.extend_from_slice(b"DISK");
        tail.push(0xc0);
        assert!(b.ends_with(&tail));
    }
}
