//! The harness: one seeded run of random operations against a manager and its model, checked
//! after every step. The operations live in the child modules.

mod admission;
mod generate;
mod operations;

use std::collections::{HashMap, HashSet};

use kvblock::error::KvError;
use kvblock::manager::{KvCacheManager, KvCacheStats, Request, RequestPhase, RequestState};
use kvblock::pool::Level;
use kvblock::retention::{RetentionConfig, TokenRangeRetention};

use crate::common::Rng;
use crate::model::*;

/// The most sequences a run keeps live.
const MAX_LIVE: usize = 6;

pub(crate) struct Harness {
    sc: Scenario,
    seed: u64,
    step: usize,
    rng: Rng,
    m: KvCacheManager,
    windows: Vec<usize>,
    seqs: HashMap<u64, Seq>,
    next_id: u64,
    /// Prefix hashes (see `Seq::hashes`) of every token prefix some store may have recorded.
    stored: HashSet<u64>,
    /// Token lists (with LoRA / salt) of stored sequences, to draw prompts that reuse them.
    history: Vec<(Vec<i32>, Option<u64>, Option<u64>)>,
    prefixes: Vec<Vec<i32>>,
    /// Pin groups: (window, block ids), one pin each.
    pins: Vec<(usize, Vec<u32>)>,
    cov: Coverage,
    /// `KVB_PROPERTY_TRACE=1` prints every operation (to reduce a failure by hand).
    trace: bool,
}

type Snapshot = (KvCacheStats, Vec<(usize, usize)>);

impl Harness {
    pub(crate) fn new(sc: Scenario, seed: u64) -> Self {
        let m = KvCacheManager::new(sc.config()).expect("valid config");
        let mut rng = Rng(seed);
        let prefixes = (0..4)
            .map(|_| {
                let len = rng.range(8, 28);
                (0..len).map(|_| 100 + rng.below(100) as i32).collect()
            })
            .collect();
        let windows = m.window_sizes();
        Harness {
            sc,
            seed,
            step: 0,
            rng,
            m,
            windows,
            seqs: HashMap::new(),
            next_id: 1,
            stored: HashSet::new(),
            history: Vec::new(),
            prefixes,
            pins: Vec::new(),
            cov: Coverage::default(),
            trace: std::env::var_os("KVB_PROPERTY_TRACE").is_some(),
        }
    }

    fn log(&self, f: impl FnOnce() -> String) {
        if self.trace {
            eprintln!("[{}] {}", self.step, f());
        }
    }

    #[track_caller]
    fn fail(&self, msg: impl std::fmt::Display) -> ! {
        panic!(
            "[{} seed {:#x} step {}] {}",
            self.sc.name, self.seed, self.step, msg
        )
    }

    fn snapshot(&self) -> Snapshot {
        let free = self
            .windows
            .iter()
            .map(|&w| self.m.num_free_blocks_of_window(w).unwrap())
            .collect();
        (self.m.stats(), free)
    }

    #[track_caller]
    fn expect_unchanged(&self, before: &Snapshot, what: &str) {
        let after = self.snapshot();
        if &after != before {
            self.fail(format!(
                "failed {what} changed the manager: {before:?} -> {after:?}"
            ));
        }
    }

    fn random_live(&mut self) -> Option<u64> {
        if self.seqs.is_empty() {
            return None;
        }
        let mut ids: Vec<u64> = self.seqs.keys().copied().collect();
        ids.sort_unstable();
        Some(ids[self.rng.below(ids.len())])
    }

    /// Records that the first `n` tokens of `id` may now be in the reuse tree.
    fn record_store(&mut self, id: u64, n: usize) {
        let seq = self.seqs.get_mut(&id).expect("live");
        if !seq.reuse {
            // Never in the tree: a later request that reuses its tokens fails the check of
            // `op_add_sequence` (reused tokens no store recorded).
            return;
        }
        let n = n.min(seq.tokens.len());
        for &h in &seq.hashes[..n] {
            self.stored.insert(h);
        }
        seq.stored_len = seq.stored_len.max(n);
        if n > 0 {
            let entry = (seq.tokens[..n].to_vec(), seq.lora, seq.salt);
            if self.history.len() < 64 {
                self.history.push(entry);
            } else {
                let i = self.rng.below(64);
                self.history[i] = entry;
            }
        }
    }

    fn pin_counts(&self) -> Vec<Vec<u32>> {
        self.windows
            .iter()
            .map(|&w| {
                let win = self.m.window(w).unwrap();
                (0..win.num_blocks() as u32)
                    .map(|b| win.arena().pins(b))
                    .collect()
            })
            .collect()
    }

    /// Records the pins added since `before`; returns the new pins of the smallest window.
    fn record_new_pins(&mut self, before: &[Vec<u32>]) -> Vec<u32> {
        let after = self.pin_counts();
        let mut smallest = Vec::new();
        for (wi, (b, a)) in before.iter().zip(&after).enumerate() {
            let mut ids = Vec::new();
            for (block, (&x, &y)) in b.iter().zip(a).enumerate() {
                if y < x {
                    self.fail(format!("block {block} lost a pin"));
                }
                for _ in x..y {
                    ids.push(block as u32);
                }
            }
            if wi == 0 {
                smallest = ids.clone();
            }
            if !ids.is_empty() {
                self.cov.pinned += ids.len();
                self.pins.push((self.windows[wi], ids));
            }
        }
        smallest
    }

    // ---- host data -----------------------------------------------------------------------

    fn slot_offset(layer: usize, kv: usize, head: usize, slot: usize, byte: usize) -> usize {
        (((layer * 2 + kv) * HEADS + head) * TPB + slot) * HEAD_SIZE + byte
    }

    /// Writes (`write`) or checks the pattern of positions `range` of sequence `id` in every
    /// window and beam (skipping blocks a sliding window detached).
    fn data(&mut self, id: u64, range: std::ops::Range<usize>, write: bool, what: &str) {
        if self.sc.pools == Pools::None || range.is_empty() {
            return;
        }
        let seq = self.seqs[&id].clone();
        for wi in 0..self.windows.len() {
            let w = self.windows[wi];
            let front = self.m.window(w).unwrap().front_blocks_removed(id);
            let (base, row_bytes) = self.m.pool_pointer(w, Level::Primary).unwrap();
            for beam in 0..seq.beam {
                let ids = self.m.cache_block_ids(id, w, beam).unwrap();
                for p in range.clone() {
                    let bi = p / TPB;
                    if bi < front {
                        continue;
                    }
                    let info = self.m.block_info(w, ids[bi]).unwrap();
                    if info.level != Level::Primary {
                        self.fail(format!("sequence {id} uses host block {}", ids[bi]));
                    }
                    let row = info.memory_index as usize;
                    // SAFETY: the pool holds `primary` rows of `row_bytes` bytes and `row` is a
                    // primary row index.
                    let row_base = unsafe { base.add(row * row_bytes) };
                    let mut bytes = read_row(self.sc.pools, row_base, row_bytes);
                    let h = seq.hashes[p];
                    for layer in 0..LAYERS {
                        for kv in 0..2 {
                            for head in 0..HEADS {
                                for byte in 0..HEAD_SIZE {
                                    let off = Self::slot_offset(layer, kv, head, p % TPB, byte);
                                    let want = pattern(h, layer, kv, head, byte);
                                    if write {
                                        bytes[off] = want;
                                    } else if bytes[off] != want {
                                        self.fail(format!(
                                            "{what}: sequence {id} window {w} beam {beam} \
                                             position {p} (block {} row {row}) layer {layer} \
                                             kv {kv} head {head}: byte {} != expected {want}",
                                            ids[bi], bytes[off]
                                        ));
                                    }
                                }
                            }
                        }
                    }
                    if write {
                        write_row(self.sc.pools, row_base, &bytes);
                    }
                }
            }
        }
    }

    fn step_once(&mut self) {
        match self.rng.below(100) {
            0..=21 => {
                if self.seqs.len() >= MAX_LIVE {
                    self.op_remove()
                } else {
                    self.op_add_sequence()
                }
            }
            22..=51 => self.op_add_token(),
            52..=55 => self.op_store_context(),
            56..=58 => self.op_store_new_block(),
            59..=62 => self.op_store_for_reuse(),
            63..=64 => self.op_pin_blocks(),
            65..=68 => self.op_unpin(),
            69..=80 => self.op_remove(),
            81..=85 => self.op_rewind(),
            86..=88 => {
                self.log(|| "refresh_blocks".into());
                self.m.refresh_blocks()
            }
            89..=91 => {
                let ms = self.rng.range(0, 40) as u64;
                self.log(|| format!("advance_time {ms}"));
                self.m.advance_time(ms).unwrap();
            }
            92..=95 => self.op_offload(),
            96 if self.rng.percent(30) => self.op_reset_reuse_state(),
            96..=97 => self.op_truncate_blocks(),
            _ => self.op_pinned_lookup(),
        }
    }

    fn check(&mut self) {
        if let Err(e) = self.m.check_invariants() {
            self.fail(format!("invariant: {e}"));
        }
        let mut ids: Vec<u64> = self.seqs.keys().copied().collect();
        ids.sort_unstable();
        if self.m.num_sequences() != ids.len() {
            self.fail(format!(
                "manager has {} sequences, model {}",
                self.m.num_sequences(),
                ids.len()
            ));
        }
        for id in ids {
            let len = self.seqs[&id].tokens.len();
            match self.m.num_tokens(id) {
                Ok(n) if n == len => {}
                other => self.fail(format!("sequence {id}: {other:?} tokens, model {len}")),
            }
            self.data(id, 0..len, false, "live sequence data");
        }
    }

    pub(crate) fn run(mut self, steps: usize) -> Coverage {
        let dump: Option<usize> = std::env::var("DUMP_FROM").ok().map(|v| v.parse().unwrap());
        for step in 0..steps {
            self.step = step;
            if self.trace && dump.is_some_and(|d| step >= d) {
                for &w in &self.windows.clone() {
                    let nb = self.m.window(w).unwrap().num_blocks() as u32;
                    for b in 0..nb {
                        let i = self.m.block_info(w, b).unwrap();
                        eprintln!("   w{w} b{b} {:?} row{} rc{} pr{} tree{} leaf{} free{} nt{} parent{:?}", i.level, i.memory_index, i.ref_count, i.priority, i.in_reuse_tree, i.is_leaf, i.is_free, i.num_tokens, i.parent);
                    }
                }
                let mut ids: Vec<u64> = self.seqs.keys().copied().collect();
                ids.sort_unstable();
                for id in ids {
                    for &w in &self.windows.clone() {
                        eprintln!(
                            "   seq {id} w{w} {:?} front {}",
                            self.m.cache_block_ids(id, w, 0).unwrap(),
                            self.m.window(w).unwrap().front_blocks_removed(id)
                        );
                    }
                }
            }
            self.step_once();
            self.check();
        }
        // Drain: release everything; all primary blocks must come back.
        self.step = steps;
        let mut ids: Vec<u64> = self.seqs.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.m.remove_sequence(id, true).unwrap();
            self.seqs.remove(&id);
        }
        for (w, ids) in std::mem::take(&mut self.pins) {
            self.m.unpin_blocks_by_id(w, &ids).unwrap();
        }
        self.check();
        for &w in &self.windows {
            let (p, s) = self.m.num_free_blocks_of_window(w).unwrap();
            if p != self.sc.primary || s != self.sc.secondary {
                self.fail(format!(
                    "window {w}: {p} primary / {s} host blocks free at the end"
                ));
            }
        }
        let s = self.m.stats();
        self.cov.offloaded = s.offloaded_blocks;
        self.cov.onboarded = s.onboarded_blocks;
        self.cov
    }
}
