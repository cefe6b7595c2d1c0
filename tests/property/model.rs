//! The reference model: the byte pattern of a computed position, the scenarios, a live
//! sequence as the test tracks it, and what a run reached.

use kvblock::manager::{CopyBackend, ManagerConfig, WindowSpec};

use crate::common;

/// Tokens per block.
pub(crate) const TPB: usize = 4;
/// The managers' maximum sequence length (and the full-attention window).
pub(crate) const MAX_SEQ: usize = 64;
pub(crate) const LAYERS: usize = 2;
pub(crate) const HEADS: usize = 2;
/// Bytes of one head's slice of a token (one byte per element).
pub(crate) const HEAD_SIZE: usize = 2;

pub(crate) fn mix(h: u64, v: u64) -> u64 {
    let mut z = h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash of the empty prefix under a LoRA id and salt ("none" differs from 0).
pub(crate) fn base_hash(lora: Option<u64>, salt: Option<u64>) -> u64 {
    let enc = |o: Option<u64>| o.map_or(0, |v| v.wrapping_add(1));
    mix(mix(0x6b76_626c_6f63_6b00, enc(lora)), enc(salt))
}

/// The byte at (layer, K|V, head, byte of the token's head slice) of a position whose prefix
/// hash (tokens up to and including it) is `h`.
pub(crate) fn pattern(h: u64, layer: usize, kv: usize, head: usize, byte: usize) -> u8 {
    (mix(
        h,
        (((layer * 2 + kv) * HEADS + head) * HEAD_SIZE + byte) as u64,
    ) & 0xff) as u8
}

#[derive(Clone, Debug)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) windows: Vec<usize>,
    pub(crate) primary: usize,
    pub(crate) secondary: usize,
    pub(crate) partial: bool,
    pub(crate) copy_on_partial: bool,
    pub(crate) pools: Pools,
}

/// Where the pools' bytes live; with real bytes, every reused position is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pools {
    None,
    Host,
    /// GPU and pinned host memory: rows are read and written with synchronous copies, which the
    /// legacy default stream (the manager's engine stream here) orders after kvblock's kernels.
    Cuda,
}

impl Scenario {
    pub(crate) fn config(&self) -> ManagerConfig {
        ManagerConfig {
            windows: self
                .windows
                .iter()
                .map(|&w| WindowSpec {
                    num_layers: LAYERS,
                    num_kv_heads: HEADS,
                    size_per_head: HEAD_SIZE,
                    ..common::window(w, self.primary, self.secondary)
                })
                .collect(),
            tokens_per_block: TPB,
            max_beam_width: 2,
            max_sequence_length: MAX_SEQ,
            enable_block_reuse: true,
            enable_partial_reuse: self.partial,
            copy_on_partial_reuse: self.copy_on_partial,
            onboard_blocks: true,
            bytes_per_element: 1,
            copy_backend: match self.pools {
                Pools::None => CopyBackend::None,
                Pools::Host => CopyBackend::HostMemory,
                Pools::Cuda => CopyBackend::Cuda,
            },
            manual_clock: true,
            ..ManagerConfig::default()
        }
    }
}

/// The model of one live sequence.
#[derive(Clone, Debug)]
pub(crate) struct Seq {
    pub(crate) tokens: Vec<i32>,
    /// `hashes[p]` = hash of tokens `0..=p` under the sequence's LoRA id and salt.
    pub(crate) hashes: Vec<u64>,
    pub(crate) input_length: usize,
    pub(crate) beam: usize,
    pub(crate) lora: Option<u64>,
    pub(crate) salt: Option<u64>,
    /// Tokens of this sequence that a store may have put in the reuse tree. Rewinds may go below
    /// it: the manager copies (or uncaches) the block that will be written again, see
    /// `rewinding_into_stored_blocks_rewrites_cached_kv`.
    pub(crate) stored_len: usize,
    /// False for a request that opted out of reuse: nothing of it may ever be stored.
    pub(crate) reuse: bool,
}

impl Seq {
    pub(crate) fn new(
        tokens: &[i32],
        lora: Option<u64>,
        salt: Option<u64>,
        beam: usize,
        reuse: bool,
    ) -> Self {
        let mut s = Seq {
            tokens: Vec::new(),
            hashes: Vec::new(),
            input_length: tokens.len(),
            beam,
            lora,
            salt,
            stored_len: 0,
            reuse,
        };
        for &t in tokens {
            s.push(t);
        }
        s
    }

    pub(crate) fn push(&mut self, t: i32) {
        let prev = self
            .hashes
            .last()
            .copied()
            .unwrap_or_else(|| base_hash(self.lora, self.salt));
        self.hashes.push(mix(prev, t as u32 as u64));
        self.tokens.push(t);
    }

    pub(crate) fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.hashes.truncate(n);
    }
}

/// Things the run did, summed per scenario, so the test fails if the generator stops reaching
/// the interesting paths.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct Coverage {
    pub(crate) admitted: usize,
    pub(crate) batch_admitted: usize,
    pub(crate) reuse_hits: usize,
    pub(crate) partial_hits: usize,
    pub(crate) beam_admitted: usize,
    pub(crate) opted_out_admitted: usize,
    pub(crate) oob_admissions: usize,
    pub(crate) oob_tokens: usize,
    pub(crate) rewinds: usize,
    pub(crate) unsupported_rewinds: usize,
    pub(crate) pinned: usize,
    pub(crate) unpinned: usize,
    pub(crate) explicit_offloads: usize,
    pub(crate) held_round_trips: usize,
    pub(crate) offloaded: u64,
    pub(crate) onboarded: u64,
    pub(crate) verified_reused_positions: usize,
    pub(crate) resets: usize,
    pub(crate) truncations: usize,
    pub(crate) pinned_lookups: usize,
}

/// A pool row's bytes (host memory, or GPU memory read with a synchronous copy).
pub(crate) fn read_row(pools: Pools, row: *mut u8, row_bytes: usize) -> Vec<u8> {
    match pools {
        // SAFETY: `row` starts a row of `row_bytes` bytes in the host pool.
        Pools::Host => unsafe { std::slice::from_raw_parts(row, row_bytes) }.to_vec(),
        Pools::Cuda => common::cuda_read(row as u64, row_bytes),
        Pools::None => unreachable!("no pool memory"),
    }
}

pub(crate) fn write_row(pools: Pools, row: *mut u8, bytes: &[u8]) {
    match pools {
        // SAFETY: as in `read_row`.
        Pools::Host => unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), row, bytes.len()) },
        Pools::Cuda => common::cuda_write(row as u64, bytes),
        Pools::None => unreachable!("no pool memory"),
    }
}
