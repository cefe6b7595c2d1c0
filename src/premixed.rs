//! A hash map for keys that are already well mixed (block ids, request ids, 64-bit hashes): a
//! multiply-rotate hasher instead of SipHash. Used by every layer, so it depends on nothing.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for keys that are already well-mixed 64-bit hashes.
#[derive(Default)]
pub struct PremixedHasher(u64);

impl Hasher for PremixedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 ^ u64::from(v)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(29) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub type PremixedMap<K, V> = HashMap<K, V, BuildHasherDefault<PremixedHasher>>;
