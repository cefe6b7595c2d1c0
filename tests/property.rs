//! Property test: random operation sequences on `KvCacheManager`, checked after every step.
//!
//! Each run drives a manager with a seeded generator through admissions, single and in batches
//! (prompts drawn from a few shared prefixes and from earlier stored sequences, with random
//! suffixes, LoRA ids, cache salts, beam width 2 and retention configs), generated tokens, the
//! store entry points, releases with and without store, rewinds, pins and unpins, refreshes,
//! clock steps and explicit offloads, with primary pools small enough that eviction, host offload
//! and out-of-blocks failures are common. After every step:
//! * `check_invariants()` holds (queues, reference counts, trees, window bounds);
//! * the reference model agrees: every live sequence's token count; after an admission the
//!   prepopulated length is below the input length, the reused prompt prefix is a prefix that an
//!   earlier store recorded (same LoRA / salt), and reused + missed = context blocks per window;
//! * the scheduler's figures are what happens: `estimate_batch` (reuse, allocations, reused and
//!   missed blocks, free blocks consumed, what fits), `needed_blocks_one_step` for a generation
//!   step, `scheduling_remove_sequence` for a release, `count_reusable_blocks` (one window);
//! * a failed call changed nothing (stats and free counts), and only expected failures happen
//!   (out of blocks, sequence too long, unsupported rewinds);
//! * with the host copy backend, every live sequence's rows hold the bytes written for its tokens:
//!   rows are filled with a pattern derived from (prefix of tokens up to the position, LoRA, salt,
//!   layer, K|V, head, byte) when a position is computed, and reused positions must already hold
//!   that pattern after any sharing, takeover, partial copy, offload and onboard.
//!
//! A failure names the configuration, seed and step; `KVB_PROPERTY_TRACE=1` prints every
//! operation, `KVB_PROPERTY_SEEDS=n` runs n other seeds (longer fuzzing).

mod common;

use common::window;

use common::Rng;
use std::collections::{HashMap, HashSet};

use kvblock::error::KvError;
use kvblock::manager::{
    CopyBackend, KvCacheManager, KvCacheStats, ManagerConfig, Request, RequestPhase, RequestState,
    WindowSpec,
};
use kvblock::pool::Level;
use kvblock::retention::{RetentionConfig, TokenRangeRetention};

const TPB: usize = 4;
const MAX_SEQ: usize = 64;
const LAYERS: usize = 2;
const HEADS: usize = 2;
const HEAD_SIZE: usize = 2; // bytes per element is 1
const MAX_LIVE: usize = 6;
const STEPS: usize = 4000;
const SEEDS: [u64; 5] = [
    0x5eed_0001,
    0xdead_beef_0002,
    0x0123_4567_89ab_cdef,
    0x6f9b_deae_c44f_e258,
    0x4e89_619d_bf41_e9c7,
];

fn mix(h: u64, v: u64) -> u64 {
    let mut z = h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash of the empty prefix under a LoRA id and salt ("none" differs from 0).
fn base_hash(lora: Option<u64>, salt: Option<u64>) -> u64 {
    let enc = |o: Option<u64>| o.map_or(0, |v| v.wrapping_add(1));
    mix(mix(0x6b76_626c_6f63_6b00, enc(lora)), enc(salt))
}

/// The byte at (layer, K|V, head, byte of the token's head slice) of a position whose prefix
/// hash (tokens up to and including it) is `h`.
fn pattern(h: u64, layer: usize, kv: usize, head: usize, byte: usize) -> u8 {
    (mix(
        h,
        (((layer * 2 + kv) * HEADS + head) * HEAD_SIZE + byte) as u64,
    ) & 0xff) as u8
}

#[derive(Clone, Debug)]
struct Scenario {
    name: &'static str,
    windows: Vec<usize>,
    primary: usize,
    secondary: usize,
    partial: bool,
    copy_on_partial: bool,
    pools: Pools,
}

/// Where the pools' bytes live; with real bytes, every reused position is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pools {
    None,
    Host,
    /// GPU and pinned host memory: rows are read and written with synchronous copies, which the
    /// legacy default stream (the manager's engine stream here) orders after kvblock's kernels.
    Cuda,
}

impl Scenario {
    fn config(&self) -> ManagerConfig {
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
struct Seq {
    tokens: Vec<i32>,
    /// `hashes[p]` = hash of tokens `0..=p` under the sequence's LoRA id and salt.
    hashes: Vec<u64>,
    input_length: usize,
    beam: usize,
    lora: Option<u64>,
    salt: Option<u64>,
    /// Tokens of this sequence that a store may have put in the reuse tree. Rewinds may go below
    /// it: the manager copies (or uncaches) the block that will be written again, see
    /// `rewinding_into_stored_blocks_rewrites_cached_kv`.
    stored_len: usize,
    /// False for a request that opted out of reuse: nothing of it may ever be stored.
    reuse: bool,
}

impl Seq {
    fn new(tokens: &[i32], lora: Option<u64>, salt: Option<u64>, beam: usize, reuse: bool) -> Self {
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

    fn push(&mut self, t: i32) {
        let prev = self
            .hashes
            .last()
            .copied()
            .unwrap_or_else(|| base_hash(self.lora, self.salt));
        self.hashes.push(mix(prev, t as u32 as u64));
        self.tokens.push(t);
    }

    fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.hashes.truncate(n);
    }
}

/// Things the run did, summed per scenario, so the test fails if the generator stops reaching
/// the interesting paths.
#[derive(Default, Debug, Clone, Copy)]
struct Coverage {
    admitted: usize,
    batch_admitted: usize,
    reuse_hits: usize,
    partial_hits: usize,
    beam_admitted: usize,
    opted_out_admitted: usize,
    oob_admissions: usize,
    oob_tokens: usize,
    rewinds: usize,
    unsupported_rewinds: usize,
    pinned: usize,
    unpinned: usize,
    explicit_offloads: usize,
    held_round_trips: usize,
    offloaded: u64,
    onboarded: u64,
    verified_reused_positions: usize,
    resets: usize,
    truncations: usize,
    pinned_lookups: usize,
}

struct Harness {
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
    fn new(sc: Scenario, seed: u64) -> Self {
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

    // ---- operations ------------------------------------------------------------------------

    fn random_prompt(&mut self) -> (Vec<i32>, Option<u64>, Option<u64>) {
        let mut lora = self.rng.percent(20).then(|| self.rng.below(2) as u64);
        let mut salt = self.rng.percent(10).then(|| self.rng.below(2) as u64);
        let mut tokens: Vec<i32> = match self.rng.below(10) {
            0..=5 => {
                let p = self.prefixes[self.rng.below(self.prefixes.len())].clone();
                let cut = self.rng.range(0, p.len());
                p[..cut].to_vec()
            }
            6..=8 if !self.history.is_empty() => {
                let (t, l, s) = self.history[self.rng.below(self.history.len())].clone();
                if self.rng.percent(85) {
                    lora = l;
                    salt = s;
                }
                let cut = self.rng.range(0, t.len());
                t[..cut].to_vec()
            }
            _ => Vec::new(),
        };
        let suffix = self.rng.range(0, 10);
        for _ in 0..suffix {
            tokens.push(self.rng.below(4) as i32);
        }
        if tokens.is_empty() {
            tokens.push(self.rng.below(4) as i32);
        }
        tokens.truncate(MAX_SEQ - 4);
        (tokens, lora, salt)
    }

    fn random_retention(&mut self, len: usize) -> RetentionConfig {
        let dur = |rng: &mut Rng| rng.percent(50).then(|| rng.range(0, 80) as u64);
        let mut ranges = Vec::new();
        let k = self.rng.range(0, len);
        if k > 0 {
            ranges.push(TokenRangeRetention {
                token_start: 0,
                token_end: Some(k as i32),
                priority: self.rng.range(0, 100) as i32,
                duration_ms: dur(&mut self.rng),
            });
        }
        if self.rng.percent(70) {
            ranges.push(TokenRangeRetention {
                token_start: k as i32,
                token_end: None,
                priority: self.rng.range(0, 100) as i32,
                duration_ms: dur(&mut self.rng),
            });
        }
        let decode = self.rng.range(0, 100) as i32;
        let decode_dur = dur(&mut self.rng);
        RetentionConfig::new(ranges, decode, decode_dur).expect("valid retention")
    }

    fn random_request(&mut self) -> Request {
        let (tokens, lora, salt) = self.random_prompt();
        let id = self.next_id;
        self.next_id += 1;
        let mut req = Request::new(id, tokens.clone());
        req.beam_width = if self.rng.percent(15) { 2 } else { 1 };
        req.lora_task_id = lora;
        req.cache_salt = salt;
        if self.rng.percent(10) && tokens.len() > 1 {
            // Extra tokens past the input length are ignored.
            req.input_length = self.rng.range(1, tokens.len() - 1);
        }
        if self.rng.percent(25) {
            req.retention = self.random_retention(tokens.len());
        }
        // Some requests opt out of reuse (TensorRT-LLM's per-call isEnableBlockReuse = false).
        req.disable_reuse = self.rng.percent(8);
        req
    }

    fn op_add_sequence(&mut self) {
        // Mostly single admissions; sometimes a batch of 2 or 3 (all or nothing, or the longest
        // prefix that fits).
        let n = if self.rng.percent(25) {
            self.rng
                .range(2, 3)
                .min(MAX_LIVE.saturating_sub(self.seqs.len()).max(1))
        } else {
            1
        };
        let reqs: Vec<Request> = (0..n).map(|_| self.random_request()).collect();
        let longest_prefix = n > 1 && self.rng.percent(50);
        // With one window, every consecutive full prompt block in the tree is reused.
        let reusable_blocks = if self.windows.len() == 1 {
            let w = self.windows[0];
            self.m
                .count_reusable_blocks(&reqs[0], w, false)
                .unwrap_or_else(|e| self.fail(format!("count_reusable_blocks: {e}")))
        } else {
            0
        };
        let before = self.snapshot();
        // The scheduler's estimate changes nothing and is exactly what admission delivers.
        let estimates = self
            .m
            .estimate_batch(&reqs)
            .unwrap_or_else(|e| self.fail(format!("estimate_batch: {e}")));
        self.expect_unchanged(&before, "estimate_batch");
        let result = if n == 1 {
            self.m.add_sequence(&reqs[0]).map(|a| vec![a])
        } else {
            self.m.add_sequence_batch(&reqs, longest_prefix)
        };
        self.log(|| {
            let described: Vec<String> = reqs
                .iter()
                .map(|r| {
                    format!(
                        "{} tokens {:?} input {} beam {} lora {:?} salt {:?} retention {:?}",
                        r.id,
                        r.token_ids,
                        r.input_length,
                        r.beam_width,
                        r.lora_task_id,
                        r.cache_salt,
                        r.retention
                    )
                })
                .collect();
            format!("add_sequence(longest_prefix {longest_prefix}) {described:?} -> {result:?}")
        });
        let admissions = match result {
            Ok(a) => a,
            Err(KvError::OutOfBlocks { .. }) => {
                self.cov.oob_admissions += 1;
                self.expect_unchanged(&before, "add_sequence");
                if reqs.iter().any(|r| self.m.has_sequence(r.id)) {
                    self.fail("a failed admission left a sequence behind");
                }
                if estimates.iter().all(|e| e.fits) {
                    self.fail(format!(
                        "estimated to fit, admission ran out: {estimates:?}"
                    ));
                }
                return;
            }
            Err(e) => self.fail(format!("add_sequence of {} requests: {e}", reqs.len())),
        };
        let fitting = estimates.iter().take_while(|e| e.fits).count();
        if admissions.len() != fitting && (longest_prefix || admissions.len() != n) {
            self.fail(format!(
                "admitted {} of {n}, estimated to fit {fitting}: {estimates:?}",
                admissions.len()
            ));
        }
        if admissions.len() < n {
            self.cov.oob_admissions += 1;
        }
        let after = self.snapshot();
        let consumed: usize = before.1.iter().zip(&after.1).map(|(b, a)| b.0 - a.0).sum();
        let estimated: usize = estimates[..admissions.len()]
            .iter()
            .map(|e| e.free_blocks_consumed)
            .sum();
        if consumed != estimated {
            self.fail(format!(
                "admission consumed {consumed} free primary blocks, estimated {estimated}"
            ));
        }
        for r in &reqs[admissions.len()..] {
            if self.m.has_sequence(r.id) {
                self.fail(format!(
                    "request {} was not admitted but has a sequence",
                    r.id
                ));
            }
        }
        if let Some(first) = admissions.first() {
            if !reqs[0].disable_reuse && first.prepopulated_prompt_len < reusable_blocks * TPB {
                self.fail(format!(
                    "count_reusable_blocks found {reusable_blocks} blocks, admission reused {} \
                     tokens",
                    first.prepopulated_prompt_len
                ));
            }
        }
        let mut admitted = Vec::new();
        for ((req, adm), est) in reqs.iter().zip(&admissions).zip(&estimates) {
            let id = req.id;
            let input = req.input_length;
            let prepop = adm.prepopulated_prompt_len;
            let got = (
                prepop,
                adm.stats.alloc_total_blocks as usize,
                adm.stats.reused_blocks as usize,
                adm.stats.missed_blocks as usize,
            );
            let want = (
                est.reusable_tokens,
                est.allocated_blocks,
                est.reused_blocks,
                est.missed_blocks,
            );
            if got != want {
                self.fail(format!(
                    "request {id}: admission (prepopulated, allocated, reused, missed) {got:?} \
                     != estimate {want:?}"
                ));
            }
            let seq = Seq::new(
                &req.token_ids[..input],
                req.lora_task_id,
                req.cache_salt,
                req.beam_width,
                !req.disable_reuse,
            );
            if prepop >= input {
                self.fail(format!("prepopulated {prepop} >= input length {input}"));
            }
            if req.disable_reuse && (prepop > 0 || adm.stats.reused_blocks > 0) {
                self.fail(format!(
                    "request {id} opted out of reuse and reused {prepop} tokens"
                ));
            }
            if prepop > 0 && !self.stored.contains(&seq.hashes[prepop - 1]) {
                self.fail(format!(
                    "request {id} reused {prepop} tokens {:?} (lora {:?}, salt {:?}) that no \
                     store recorded",
                    &req.token_ids[..prepop],
                    req.lora_task_id,
                    req.cache_salt
                ));
            }
            let context_blocks = self.windows.len() * input.div_ceil(TPB);
            let counted = (adm.stats.reused_blocks + adm.stats.missed_blocks) as usize;
            if counted != context_blocks {
                self.fail(format!(
                    "reused {} + missed {} != {context_blocks} context blocks",
                    adm.stats.reused_blocks, adm.stats.missed_blocks
                ));
            }
            self.cov.admitted += 1;
            self.cov.batch_admitted += usize::from(n > 1);
            self.cov.beam_admitted += usize::from(req.beam_width > 1);
            self.cov.opted_out_admitted += usize::from(req.disable_reuse);
            self.cov.reuse_hits += usize::from(prepop > 0);
            self.cov.partial_hits += usize::from(prepop % TPB != 0);
            self.cov.verified_reused_positions += prepop;
            self.seqs.insert(id, seq);
            admitted.push((id, prepop, input));
        }
        // The whole batch's copies are done: check every reused position before the engine
        // computes (writes) any of the new ones.
        for &(id, prepop, _) in &admitted {
            self.data(id, 0..prepop, false, "reused prompt data");
        }
        for &(id, prepop, input) in &admitted {
            self.data(id, prepop..input, true, "");
        }
    }

    fn op_add_token(&mut self) {
        let Some(id) = self.random_live() else {
            return self.op_add_sequence();
        };
        let token = self.rng.below(4) as i32;
        let len = self.seqs[&id].tokens.len();
        let beam = self.seqs[&id].beam;
        // The scheduler's one-step estimate, summed over windows, is what the step allocates.
        let state = RequestState {
            request_id: id,
            phase: RequestPhase::Generation,
            prompt_len: self.seqs[&id].input_length,
            beam_width: beam,
            context_chunk_size: 0,
            num_draft_tokens: 0,
            max_new_tokens: MAX_SEQ,
            num_generated_tokens: len - self.seqs[&id].input_length,
        };
        let mut needed = 0;
        for w in self.windows.clone() {
            needed += self
                .m
                .needed_blocks_one_step(&state, None, false, w)
                .unwrap_or_else(|e| self.fail(format!("needed_blocks_one_step: {e}")));
        }
        let before = self.snapshot();
        let result = self.m.add_token(id, token);
        self.log(|| format!("add_token {id} {token} -> {result:?}"));
        match result {
            Ok(()) => {
                if len >= MAX_SEQ {
                    self.fail(format!("add_token past the maximum length ({len} tokens)"));
                }
                self.seqs.get_mut(&id).unwrap().push(token);
                let allocated =
                    (self.m.stats().alloc_total_blocks - before.0.alloc_total_blocks) as usize;
                if allocated != needed {
                    self.fail(format!(
                        "add_token allocated {allocated} blocks, needed_blocks_one_step said \
                         {needed}"
                    ));
                }
                self.data(id, len..len + 1, true, "");
                if self.rng.percent(40) {
                    self.log(|| format!("store_new_block {id}"));
                    self.m
                        .store_new_block(id)
                        .unwrap_or_else(|e| self.fail(format!("store_new_block: {e}")));
                    // Stores the block the new token completed: tokens 0..len.
                    if len.is_multiple_of(TPB) {
                        self.record_store(id, len);
                    }
                }
            }
            Err(KvError::SequenceTooLong { .. }) if len >= MAX_SEQ => {
                self.expect_unchanged(&before, "add_token");
            }
            Err(KvError::OutOfBlocks { .. }) => {
                self.cov.oob_tokens += 1;
                self.expect_unchanged(&before, "add_token");
                if self.m.num_tokens(id).unwrap() != len {
                    self.fail("a failed add_token appended the token");
                }
            }
            Err(e) => self.fail(format!("add_token({id}): {e}")),
        }
    }

    fn op_store_context(&mut self) {
        let Some(id) = self.random_live() else { return };
        let input = self.seqs[&id].input_length;
        let pos = self.rng.range(0, input);
        self.log(|| format!("store_context_blocks {id} {pos}"));
        self.m
            .store_context_blocks(id, pos)
            .unwrap_or_else(|e| self.fail(format!("store_context_blocks({id}, {pos}): {e}")));
        let n = pos.min(input - 1) / TPB * TPB;
        self.record_store(id, n);
    }

    fn op_store_new_block(&mut self) {
        let Some(id) = self.random_live() else { return };
        self.log(|| format!("store_new_block {id}"));
        self.m
            .store_new_block(id)
            .unwrap_or_else(|e| self.fail(format!("store_new_block({id}): {e}")));
        let n = self.seqs[&id].tokens.len() - 1;
        if n.is_multiple_of(TPB) {
            self.record_store(id, n);
        }
    }

    fn op_store_for_reuse(&mut self) {
        let Some(id) = self.random_live() else { return };
        let pin = self.rng.percent(60) && self.pins.len() < 8;
        let before = self.pin_counts();
        let ids = self
            .m
            .store_blocks_for_reuse(id, pin, None, usize::MAX)
            .unwrap_or_else(|e| self.fail(format!("store_blocks_for_reuse({id}): {e}")));
        self.log(|| format!("store_blocks_for_reuse {id} pin {pin} -> {ids:?}"));
        let n = self.seqs[&id].tokens.len() - 1;
        self.record_store(id, n);
        let mut new_pins = self.record_new_pins(&before);
        if !pin && !new_pins.is_empty() {
            self.fail("store without pin pinned blocks");
        }
        let mut returned = ids.clone();
        returned.sort_unstable();
        new_pins.sort_unstable();
        if returned != new_pins {
            self.fail(format!(
                "store_blocks_for_reuse returned pins {ids:?}, the smallest window gained {new_pins:?}"
            ));
        }
    }

    fn op_pin_blocks(&mut self) {
        if self.pins.len() >= 8 {
            return self.op_unpin();
        }
        let Some(id) = self.random_live() else { return };
        let before = self.pin_counts();
        self.log(|| format!("pin_blocks {id}"));
        self.m
            .pin_blocks(id)
            .unwrap_or_else(|e| self.fail(format!("pin_blocks({id}): {e}")));
        self.record_new_pins(&before);
    }

    fn op_unpin(&mut self) {
        if self.pins.is_empty() {
            return;
        }
        let i = self.rng.below(self.pins.len());
        let (w, mut ids) = self.pins.swap_remove(i);
        // Sometimes only part of the group.
        if ids.len() > 1 && self.rng.percent(30) {
            let keep = ids.split_off(self.rng.range(1, ids.len() - 1));
            self.pins.push((w, keep));
        }
        self.log(|| format!("unpin_blocks_by_id {w} {ids:?}"));
        self.m
            .unpin_blocks_by_id(w, &ids)
            .unwrap_or_else(|e| self.fail(format!("unpin_blocks_by_id({w}, {ids:?}): {e}")));
        self.cov.unpinned += ids.len();
    }

    fn op_remove(&mut self) {
        let Some(id) = self.random_live() else { return };
        let store = self.rng.percent(70);
        self.log(|| format!("remove_sequence {id} store {store}"));
        // The scheduling simulation predicts the free blocks after the removal.
        self.m.start_scheduling();
        self.m.scheduling_remove_sequence(id).unwrap();
        let predicted: Vec<usize> = self
            .windows
            .iter()
            .map(|&w| self.m.window(w).unwrap().scheduling_free_blocks())
            .collect();
        if store {
            let n = self.seqs[&id].tokens.len() - 1;
            self.record_store(id, n);
        }
        self.m
            .remove_sequence(id, store)
            .unwrap_or_else(|e| self.fail(format!("remove_sequence({id}, {store}): {e}")));
        self.seqs.remove(&id);
        let free: Vec<usize> = self.snapshot().1.iter().map(|f| f.0).collect();
        if free != predicted {
            self.fail(format!(
                "scheduling_remove_sequence predicted {predicted:?} free blocks, removal left \
                 {free:?}"
            ));
        }
    }

    fn op_rewind(&mut self) {
        let Some(id) = self.random_live() else { return };
        let seq = &self.seqs[&id];
        let len = seq.tokens.len();
        let floor = seq.input_length;
        if len <= floor {
            return;
        }
        let n = self.rng.range(1, len - floor);
        let beam = seq.beam;
        let before = self.snapshot();
        let result = self.m.rewind(id, n);
        self.log(|| format!("rewind {id} {n} -> {result:?}"));
        match result {
            Ok(()) => {
                if beam > 1 {
                    self.fail("rewind accepted a beam-search sequence");
                }
                self.cov.rewinds += 1;
                self.seqs.get_mut(&id).unwrap().truncate(len - n);
            }
            Err(KvError::Unsupported(_)) | Err(KvError::OutOfBlocks { .. }) => {
                self.cov.unsupported_rewinds += 1;
                self.expect_unchanged(&before, "rewind");
                if self.m.num_tokens(id).unwrap() != len {
                    self.fail("a failed rewind removed tokens");
                }
            }
            Err(e) => self.fail(format!("rewind({id}, {n}): {e}")),
        }
    }

    fn op_offload(&mut self) {
        let w = self.windows[self.rng.below(self.windows.len())];
        let num_blocks = self.m.window(w).unwrap().num_blocks() as u32;
        let free_primary: Vec<u32> = (0..num_blocks)
            .filter(|&b| {
                let i = self.m.block_info(w, b).unwrap();
                i.is_free && i.level == Level::Primary
            })
            .collect();
        let before = self.snapshot();
        if free_primary.is_empty() || self.rng.percent(10) {
            // A block sequences hold goes to the host tier and back (TensorRT-LLM's offload and
            // onboard of a held block): its sequences keep it, and its bytes come back, which
            // the reuse checks of later admissions read.
            let referenced: Vec<u32> = (0..num_blocks)
                .filter(|&b| {
                    let info = self.m.block_info(w, b).unwrap();
                    info.ref_count > 0 && info.level == Level::Primary
                })
                .collect();
            if let Some(&b) = referenced.get(self.rng.below(referenced.len().max(1))) {
                let refs = self.m.block_info(w, b).unwrap().ref_count;
                match self.m.offload_block(w, b) {
                    Ok(true) => {
                        let info = self.m.block_info(w, b).unwrap();
                        if info.level != Level::Secondary || info.ref_count != refs {
                            self.fail(format!("held block {b} after its offload: {info:?}"));
                        }
                        if let Err(e) = self.m.check_invariants() {
                            self.fail(format!("held block {b} on the host tier: {e}"));
                        }
                        match self.m.onboard_block(w, b) {
                            Ok(true)
                                if self.m.block_info(w, b).unwrap().level == Level::Primary =>
                            {
                                self.cov.held_round_trips += 1;
                            }
                            other => self.fail(format!("onboard of held block {b}: {other:?}")),
                        }
                    }
                    Ok(false) => self.expect_unchanged(&before, "offload"),
                    // A pinned block stays (its pin promises a reader the GPU row).
                    Err(KvError::InvalidArgument(e)) if e.contains("pinned") => {
                        self.expect_unchanged(&before, "offload of a pinned block")
                    }
                    Err(e) => self.fail(format!("offload of held block {b}: {e}")),
                }
            }
            return;
        }
        let b = free_primary[self.rng.below(free_primary.len())];
        let result = self.m.offload_block(w, b);
        self.log(|| format!("offload_block {w} {b} -> {result:?}"));
        match result {
            Ok(true) => {
                self.cov.explicit_offloads += 1;
                let info = self.m.block_info(w, b).unwrap();
                if info.level != Level::Secondary || !info.is_free {
                    self.fail(format!("offloaded block {b} is {info:?}"));
                }
            }
            Ok(false) => self.expect_unchanged(&before, "offload"),
            Err(e) => self.fail(format!("offload_block({w}, {b}): {e}")),
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

    /// A stored prompt with neither LoRA nor salt (truncate_blocks keys plain tokens).
    fn plain_history_prompt(&mut self) -> Option<Vec<i32>> {
        let plain: Vec<&Vec<i32>> = self
            .history
            .iter()
            .filter(|(_, l, s)| l.is_none() && s.is_none())
            .map(|(t, _, _)| t)
            .collect();
        (!plain.is_empty()).then(|| plain[self.rng.below(plain.len())].clone())
    }

    fn op_reset_reuse_state(&mut self) {
        self.log(|| "reset_reuse_state".into());
        self.m.reset_reuse_state();
        for w in self.windows.clone() {
            if self.m.window(w).unwrap().num_in_tree() != 0 {
                self.fail(format!("window {w} keeps cached blocks after a reset"));
            }
        }
        self.cov.resets += 1;
    }

    fn op_truncate_blocks(&mut self) {
        let Some(tokens) = self.plain_history_prompt() else {
            return;
        };
        let keep = self.rng.range(0, tokens.len());
        self.log(|| format!("truncate_blocks {tokens:?} keep {keep}"));
        self.m.truncate_blocks(&tokens, keep);
        let probe = Request::new(0, tokens.clone());
        for w in self.windows.clone() {
            let left = self.m.count_reusable_blocks(&probe, w, false).unwrap();
            if left > keep.div_ceil(TPB) {
                self.fail(format!(
                    "window {w}: {left} blocks of a prompt truncated to {keep} tokens stay reusable"
                ));
            }
        }
        self.cov.truncations += 1;
    }

    /// A transceiver's lookup with pins: the chain is cached and on the GPU; its pins are
    /// dropped later by `op_unpin` like any other.
    fn op_pinned_lookup(&mut self) {
        if self.history.is_empty() || self.pins.len() >= 8 {
            return self.op_unpin();
        }
        let (tokens, lora, salt) = self.history[self.rng.below(self.history.len())].clone();
        let mut req = Request::new(0, tokens.clone());
        req.lora_task_id = lora;
        req.cache_salt = salt;
        let n = self.rng.range(1, tokens.len());
        let w = self.windows[self.rng.below(self.windows.len())];
        self.log(|| format!("find_blocks_in_reuse_tree {tokens:?} n {n} window {w} pin"));
        let chain = self
            .m
            .find_blocks_in_reuse_tree(&req, n, w, true)
            .unwrap_or_else(|e| self.fail(format!("find_blocks_in_reuse_tree: {e}")));
        for &b in &chain {
            let info = self.m.block_info(w, b).unwrap();
            if !info.in_reuse_tree || info.level != Level::Primary || info.ref_count == 0 {
                self.fail(format!("looked-up block {b} of window {w}: {info:?}"));
            }
        }
        if !chain.is_empty() {
            self.cov.pinned += chain.len();
            self.cov.pinned_lookups += 1;
            self.pins.push((w, chain));
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

    fn run(mut self, steps: usize) -> Coverage {
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

/// The seeds to run: the fixed ones, or with `KVB_PROPERTY_SEEDS=n` n derived ones (for longer
/// fuzzing runs; `KVB_PROPERTY_STEPS` sets the steps per run).
fn seeds() -> Vec<u64> {
    match std::env::var("KVB_PROPERTY_SEEDS") {
        Ok(n) => {
            let n: u64 = n.parse().expect("KVB_PROPERTY_SEEDS is a number");
            (0..n).map(|i| mix(0x5eed, i)).collect()
        }
        Err(_) => SEEDS.to_vec(),
    }
}

fn steps() -> usize {
    std::env::var("KVB_PROPERTY_STEPS").map_or(STEPS, |s| s.parse().expect("a number"))
}

fn run_scenario(sc: Scenario) {
    let mut total = Coverage::default();
    for seed in seeds() {
        let c = Harness::new(sc.clone(), seed).run(steps());
        total.admitted += c.admitted;
        total.batch_admitted += c.batch_admitted;
        total.reuse_hits += c.reuse_hits;
        total.partial_hits += c.partial_hits;
        total.beam_admitted += c.beam_admitted;
        total.opted_out_admitted += c.opted_out_admitted;
        total.oob_admissions += c.oob_admissions;
        total.oob_tokens += c.oob_tokens;
        total.rewinds += c.rewinds;
        total.unsupported_rewinds += c.unsupported_rewinds;
        total.pinned += c.pinned;
        total.unpinned += c.unpinned;
        total.explicit_offloads += c.explicit_offloads;
        total.held_round_trips += c.held_round_trips;
        total.offloaded += c.offloaded;
        total.onboarded += c.onboarded;
        total.verified_reused_positions += c.verified_reused_positions;
        total.resets += c.resets;
        total.truncations += c.truncations;
        total.pinned_lookups += c.pinned_lookups;
    }
    // The generator must keep reaching the paths this test is about.
    let name = sc.name;
    eprintln!("{name}: {total:?}");
    assert!(total.admitted > 300, "{name}: {total:?}");
    assert!(total.batch_admitted > 50, "{name}: {total:?}");
    assert!(total.reuse_hits > 50, "{name}: too little reuse {total:?}");
    if sc.partial {
        assert!(
            total.partial_hits > 10,
            "{name}: too little partial reuse {total:?}"
        );
    }
    assert!(total.beam_admitted > 20, "{name}: {total:?}");
    assert!(total.opted_out_admitted > 10, "{name}: {total:?}");
    assert!(
        total.oob_admissions + total.oob_tokens > 20,
        "{name}: no capacity pressure {total:?}"
    );
    assert!(total.rewinds > 10, "{name}: {total:?}");
    assert!(total.pinned > 0 && total.unpinned > 0, "{name}: {total:?}");
    assert!(total.explicit_offloads > 10, "{name}: {total:?}");
    assert!(total.held_round_trips > 10, "{name}: {total:?}");
    assert!(
        total.resets > 0 && total.truncations > 10 && total.pinned_lookups > 10,
        "{name}: {total:?}"
    );
    assert!(
        total.offloaded > 100 && total.onboarded > 20,
        "{name}: no host traffic {total:?}"
    );
    if sc.pools != Pools::None {
        assert!(total.verified_reused_positions > 500, "{name}: {total:?}");
    }
}

fn single(name: &'static str) -> Scenario {
    Scenario {
        name,
        windows: vec![MAX_SEQ],
        primary: 28,
        secondary: 10,
        partial: true,
        copy_on_partial: true,
        pools: Pools::Host,
    }
}

#[test]
fn random_operations_single_window() {
    run_scenario(single(
        "single window, partial reuse with copies, host data",
    ));
}

#[test]
fn random_operations_without_partial_reuse() {
    run_scenario(Scenario {
        partial: false,
        ..single("single window, no partial reuse, host data")
    });
}

#[test]
fn random_operations_without_copy_on_partial_reuse() {
    run_scenario(Scenario {
        copy_on_partial: false,
        ..single("single window, partial reuse without copies, host data")
    });
}

#[test]
fn random_operations_variable_sliding_window() {
    run_scenario(Scenario {
        windows: vec![16, MAX_SEQ],
        ..single("VSWA 16 + 64, partial reuse with copies, host data")
    });
}

#[test]
fn random_operations_bookkeeping_only() {
    run_scenario(Scenario {
        windows: vec![16, MAX_SEQ],
        copy_on_partial: false,
        pools: Pools::None,
        ..single("VSWA 16 + 64, partial reuse without copies, no pool memory")
    });
}

/// The same random workload with the CUDA backend: every reuse, partial copy, offload and onboard
/// moves bytes through the batched copy kernel between GPU and pinned host pools. Skips where no
/// GPU is usable.
#[test]
fn random_operations_cuda_pools() {
    if !common::cuda_context_current() {
        eprintln!("skipped: no usable CUDA GPU (driver library, device) on this machine");
        return;
    }
    run_scenario(Scenario {
        windows: vec![16, MAX_SEQ],
        pools: Pools::Cuda,
        ..single("VSWA 16 + 64, partial reuse with copies, CUDA pools")
    });
}

/// A pool row's bytes (host memory, or GPU memory read with a synchronous copy).
fn read_row(pools: Pools, row: *mut u8, row_bytes: usize) -> Vec<u8> {
    match pools {
        // SAFETY: `row` starts a row of `row_bytes` bytes in the host pool.
        Pools::Host => unsafe { std::slice::from_raw_parts(row, row_bytes) }.to_vec(),
        Pools::Cuda => common::cuda_read(row as u64, row_bytes),
        Pools::None => unreachable!("no pool memory"),
    }
}

fn write_row(pools: Pools, row: *mut u8, bytes: &[u8]) {
    match pools {
        // SAFETY: as in `read_row`.
        Pools::Host => unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), row, bytes.len()) },
        Pools::Cuda => common::cuda_write(row as u64, bytes),
        Pools::None => unreachable!("no pool memory"),
    }
}

// ---- Regressions found by the random runs --------------------------------------------------
//
// A sliding window detaches a sequence's out-of-window front blocks while the sequence keeps
// them listed; storing the sequence later inserts those blocks under its tokens. That is only
// correct while nobody replaced their content, which the manager tracks per block (TensorRT-LLM
// `KVCacheManagerSWAInvalidateReuseTest`: taking a detached block invalidates the owner's
// store-for-reuse). Allocation did; explicit offload and partial-reuse takeover did not.

/// Windows 8 (sliding) and 32, 4 tokens per block, host pools of 8-byte rows
/// ([K slots 0..4][V slots 0..4], one byte per token slot).
fn swa_host_manager(secondary: usize) -> KvCacheManager {
    let spec = |w| window(w, 8, secondary);
    KvCacheManager::new(ManagerConfig {
        windows: vec![spec(8), spec(32)],
        tokens_per_block: TPB,
        max_sequence_length: 32,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        manual_clock: true,
        ..ManagerConfig::default()
    })
    .unwrap()
}

/// Writes `value` into the K and V slots `slots` of a block's primary row.
fn fill_slots(
    m: &mut KvCacheManager,
    w: usize,
    block: u32,
    slots: std::ops::Range<usize>,
    value: u8,
) {
    let info = m.block_info(w, block).unwrap();
    assert_eq!(info.level, Level::Primary);
    let (base, row_bytes) = m.pool_pointer(w, Level::Primary).unwrap();
    assert_eq!(row_bytes, 2 * TPB);
    // SAFETY: a primary row of the host pool.
    let row = unsafe {
        std::slice::from_raw_parts_mut(base.add(info.memory_index as usize * row_bytes), row_bytes)
    };
    for s in slots {
        row[s] = value;
        row[TPB + s] = value;
    }
}

/// The K and V bytes of slot `slot` of a block's primary row.
fn slot_bytes(m: &mut KvCacheManager, w: usize, block: u32, slot: usize) -> (u8, u8) {
    let info = m.block_info(w, block).unwrap();
    assert_eq!(info.level, Level::Primary);
    let (base, row_bytes) = m.pool_pointer(w, Level::Primary).unwrap();
    // SAFETY: a primary row of the host pool.
    let row = unsafe {
        std::slice::from_raw_parts(base.add(info.memory_index as usize * row_bytes), row_bytes)
    };
    (row[slot], row[TPB + slot])
}

/// Checks that every reused position of sequence `id` holds `value` in every window.
fn expect_reused_bytes(m: &mut KvCacheManager, id: u64, value: u8) {
    let prepop = m.admission(id).unwrap().prepopulated_prompt_len;
    for w in m.window_sizes() {
        let ids = m.cache_block_ids(id, w, 0).unwrap();
        for p in 0..prepop {
            let got = slot_bytes(m, w, ids[p / TPB], p % TPB);
            assert_eq!(got, (value, value), "window {w} position {p}");
        }
    }
}

/// Offloading a block into the host row of a detached (free, host-resident) block replaces that
/// block's content: its owner must no longer store it, or the tree would hand out foreign KV.
/// Found by `random_operations_variable_sliding_window`.
#[test]
fn explicit_offload_into_a_detached_block_invalidates_the_owner_store() {
    let mut m = swa_host_manager(1);
    m.add_sequence(&Request::new(1, (10..18).collect()))
        .unwrap();
    for w in [8, 32] {
        for b in m.cache_block_ids(1, w, 0).unwrap() {
            fill_slots(&mut m, w, b, 0..TPB, 0xaa);
        }
    }
    for t in 0..4 {
        m.add_token(1, 20 + t).unwrap();
    }
    // 12 tokens: window 8 detached the first block.
    assert_eq!(m.window(8).unwrap().front_blocks_removed(1), 1);
    let detached = m.cache_block_ids(1, 8, 0).unwrap()[0];
    assert!(m.block_info(8, detached).unwrap().is_free);
    // The detached block moves to the host tier (content kept) ...
    assert!(m.offload_block(8, detached).unwrap());
    // ... and the next offload takes its host row (the only free host block) for another block.
    let other = (0..m.window(8).unwrap().num_blocks() as u32)
        .find(|&b| {
            let i = m.block_info(8, b).unwrap();
            i.is_free && i.level == Level::Primary
        })
        .unwrap();
    assert!(m.offload_block(8, other).unwrap());
    assert_eq!(m.block_info(8, detached).unwrap().level, Level::Primary);
    m.check_invariants().unwrap();

    // Sequence 1 lost a detached block's content: releasing it stores nothing.
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    let mut prompt: Vec<i32> = (10..18).collect();
    prompt.push(99);
    let a = m.add_sequence(&Request::new(2, prompt)).unwrap();
    expect_reused_bytes(&mut m, 2, 0xaa);
    assert_eq!(a.prepopulated_prompt_len, 0);
    m.check_invariants().unwrap();
}

/// Taking over a detached partial leaf lets the new sequence write it: the owner must no longer
/// store it (it would insert the taker's block under the owner's tokens).
/// Found by `random_operations_variable_sliding_window` (longer runs).
#[test]
fn takeover_of_a_detached_leaf_invalidates_the_owner_store() {
    let mut m = swa_host_manager(0);
    m.add_sequence(&Request::new(1, vec![10, 11, 12])).unwrap();
    common::prefill_done(&mut m, 1);
    // Stores tokens [10, 11] as a partial leaf in both windows.
    m.store_blocks_for_reuse(1, false, None, 0).unwrap();
    for w in [8, 32] {
        let b = m.cache_block_ids(1, w, 0).unwrap()[0];
        fill_slots(&mut m, w, b, 0..TPB, 0xaa);
    }
    for t in 0..9 {
        m.add_token(1, 20 + t).unwrap();
    }
    assert_eq!(m.window(8).unwrap().front_blocks_removed(1), 1);
    let leaf = m.cache_block_ids(1, 8, 0).unwrap()[0];
    let info = m.block_info(8, leaf).unwrap();
    assert!(info.is_free && info.in_reuse_tree && info.is_leaf);

    // Request 2 shares 2 tokens: window 8 takes the unused leaf over, window 32 copies.
    let b = m
        .add_sequence(&Request::new(2, vec![10, 11, 77, 78]))
        .unwrap();
    assert_eq!(b.prepopulated_prompt_len, 2);
    assert_eq!(m.cache_block_ids(2, 8, 0).unwrap()[0], leaf);
    expect_reused_bytes(&mut m, 2, 0xaa);
    fill_slots(&mut m, 8, leaf, 2..TPB, 0xbb);

    // Sequence 1 no longer owns its detached block: releasing it stores nothing, so the block
    // request 2 writes does not enter the tree under sequence 1's tokens.
    common::prefill_done(&mut m, 1);
    m.remove_sequence(1, true).unwrap();
    assert!(!m.block_info(8, leaf).unwrap().in_reuse_tree);
    m.check_invariants().unwrap();
    let c = m
        .add_sequence(&Request::new(3, vec![10, 11, 12, 20, 21]))
        .unwrap();
    expect_reused_bytes(&mut m, 3, 0xaa);
    assert_eq!(c.prepopulated_prompt_len, 0);
    m.check_invariants().unwrap();
}

/// Regression (TensorRT-LLM keeps such a block in the tree): when a sequence rewinds into a block
/// it stored for reuse, the tokens generated afterwards are written into that block. The manager
/// takes the block out of the tree (or copies it when shared) on rewind, so a later request with
/// the old tokens reuses only the KV of the old tokens.
#[test]
fn rewinding_into_stored_blocks_keeps_cached_kv() {
    let spec = window(32, 8, 0);
    let mut m = KvCacheManager::new(ManagerConfig {
        windows: vec![spec],
        tokens_per_block: TPB,
        max_sequence_length: 32,
        bytes_per_element: 1,
        copy_backend: CopyBackend::HostMemory,
        ..ManagerConfig::default()
    })
    .unwrap();
    m.add_sequence(&Request::new(1, (0..5).collect())).unwrap();
    for t in 5..9 {
        m.add_token(1, t).unwrap();
    }
    // Tokens 0..9; fill the KV of tokens 0..8 with 0xaa and store the two full blocks.
    for b in m.cache_block_ids(1, 32, 0).unwrap() {
        fill_slots(&mut m, 32, b, 0..TPB, 0xaa);
    }
    m.store_new_block(1).unwrap();
    // Rewind to 6 tokens and generate different tokens 6 and 7 (their KV is 0xbb).
    m.rewind(1, 3).unwrap();
    m.add_token(1, 50).unwrap();
    m.add_token(1, 51).unwrap();
    let second = m.cache_block_ids(1, 32, 0).unwrap()[1];
    fill_slots(&mut m, 32, second, 2..TPB, 0xbb);
    // A request with the original tokens 0..8 must not see the KV of tokens 50, 51.
    let mut prompt: Vec<i32> = (0..8).collect();
    prompt.push(99);
    m.add_sequence(&Request::new(2, prompt)).unwrap();
    expect_reused_bytes(&mut m, 2, 0xaa);
}
