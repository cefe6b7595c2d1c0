//! Admission phase 2: claims every block a batch reuses, then onboards, copies and allocates
//! request by request.

use super::{AdmissionPlan, KeySource, PlannedReuse, SeqBlocks, WindowBlockManager};
use crate::key::MmKey;
use crate::pool::Level;
use crate::retention::{BlockRetention, RetentionConfig};

/// One request of an admission batch, with its checked plan.
#[derive(Clone, Copy, Debug)]
pub struct AdmitItem<'a> {
    pub id: u64,
    pub src: KeySource<'a>,
    pub input_length: usize,
    pub beam_width: usize,
    pub retention: &'a RetentionConfig,
    pub plan: &'a AdmissionPlan,
}

impl WindowBlockManager {
    /// Executes the checked plans of an admission batch (every plan made against the claims of
    /// the requests before it). Phase 1 claims every reused block and copy source of every
    /// request, so no allocation of phase 2 can evict a block the batch reuses; phase 2 onboards,
    /// copies and allocates request by request; the copies of the batch are submitted together.
    /// Returns each request's `alloc_new` delta (blocks that never held tokens).
    pub fn admit_batch(&mut self, items: &[AdmitItem<'_>], now_ms: u64) -> Vec<u64> {
        let tpb = self.cfg.tokens_per_block;
        let mut protected = Vec::new();
        for item in items {
            debug_assert!(!self.seqs.contains_key(&item.id));
            for (bi, step) in item.plan.steps.iter().enumerate() {
                let r = item.retention.block_retention(bi, tpb);
                match *step {
                    PlannedReuse::Share { block } => self.claim_for_reuse(block, r),
                    PlannedReuse::TakeOver { block, .. } => {
                        self.evict_from_tree(block);
                        self.claim_for_reuse(block, r);
                        // This sequence will write the block: one that detached it may no
                        // longer store it.
                        self.alloc_epoch[block as usize] =
                            self.alloc_epoch[block as usize].wrapping_add(1);
                    }
                    PlannedReuse::Copy { source, .. } => {
                        if self.queues.claim(source) {
                            protected.push(source);
                        }
                    }
                }
            }
        }
        self.make_room_for_batch(items, now_ms);
        // A copy source goes back to the free queue once its last copy is queued, as the fit
        // check counted (`releases_copy_source`).
        let mut released_early = Vec::new();
        let mut scratch = std::mem::take(&mut self.mm_scratch);
        let mut alloc_new = Vec::with_capacity(items.len());
        for item in items {
            let before = self.stats;
            let release = match item.plan.steps.last() {
                Some(&PlannedReuse::Copy { source, .. }) if item.plan.releases_copy_source => {
                    debug_assert!(protected.contains(&source), "claimed by phase 1");
                    Some(source)
                }
                _ => None,
            };
            released_early.extend(release);
            self.allocate_planned(item, release, &mut scratch, now_ms);
            debug_assert_eq!(
                (self.stats.alloc_total - before.alloc_total) as usize,
                item.plan.allocations,
                "planned allocations are exact"
            );
            alloc_new.push(self.stats.alloc_new - before.alloc_new);
        }
        self.mm_scratch = scratch;
        for source in protected {
            if !released_early.contains(&source) && self.arena.ref_count(source) == 0 {
                self.queues
                    .release(source, self.arena.level(source), false, now_ms);
            }
        }
        self.flush_copies();
        alloc_new
    }

    /// Moves suspended sequences' blocks to the host tier when the batch's allocations need
    /// more primary blocks than are free. The blocks the batch reuses or copies from stay where
    /// they are (phase 1 claimed them but adds their references only in phase 2).
    fn make_room_for_batch(&mut self, items: &[AdmitItem<'_>], now_ms: u64) {
        let needed: usize = items.iter().map(|item| item.plan.allocations).sum();
        if needed <= self.queues.num_free(Level::Primary) || !self.has_suspended() {
            return;
        }
        let planned: std::collections::HashSet<u32> = items
            .iter()
            .flat_map(|item| item.plan.steps.iter().map(PlannedReuse::block))
            .collect();
        self.make_room(needed, &|b| planned.contains(&b), now_ms);
    }

    /// Phase 2 of one request: onboards its reused host blocks, copies partial matches,
    /// allocates misses and per-beam blocks, and records the sequence. `release`: the copy
    /// source that goes back to the free queue once its copy is queued (its last reader).
    fn allocate_planned(
        &mut self,
        item: &AdmitItem<'_>,
        release: Option<u32>,
        scratch: &mut Vec<MmKey>,
        now_ms: u64,
    ) {
        let AdmitItem {
            id,
            src,
            input_length,
            beam_width,
            retention,
            plan,
        } = *item;
        let tpb = self.cfg.tokens_per_block;
        let reusable = input_length - 1;
        let mut beams = vec![Vec::with_capacity(plan.num_context_blocks + 1); beam_width];
        let bw = beam_width as u32;
        for (bi, step) in plan.steps.iter().enumerate() {
            let r = retention.block_retention(bi, tpb);
            let block = match *step {
                PlannedReuse::Share { block } => {
                    self.onboard(block, now_ms);
                    block
                }
                PlannedReuse::TakeOver { block, .. } => {
                    self.onboard(block, now_ms);
                    let end = ((bi + 1) * tpb).min(reusable);
                    let key = src.key(bi * tpb, end, scratch);
                    self.tree.set_key(block, &key);
                    block
                }
                PlannedReuse::Copy { source, tokens } => {
                    let fresh = self.get_free_block(r, now_ms);
                    self.queue_copy(source, fresh, tokens);
                    if release == Some(source) {
                        debug_assert_eq!(self.arena.ref_count(source), 0, "nobody holds it");
                        self.queues
                            .release(source, self.arena.level(source), false, now_ms);
                    }
                    let end = ((bi + 1) * tpb).min(reusable);
                    let key = src.key(bi * tpb, end, scratch);
                    self.tree.set_key(fresh, &key);
                    fresh
                }
            };
            self.arena.add_refs(block, bw);
            for beam in &mut beams {
                beam.push(block);
            }
            self.note_reuse(block);
            self.stats.reused += 1;
        }
        for bi in plan.steps.len()..plan.num_shared_blocks {
            let r = retention.block_retention(bi, tpb);
            let block = self.get_free_block(r, now_ms);
            self.set_context_key(block, &src, bi, reusable, scratch);
            self.arena.add_refs(block, bw);
            for beam in &mut beams {
                beam.push(block);
            }
            self.stats.missed += 1;
        }
        for bi in plan.num_shared_blocks..plan.num_context_blocks {
            let r = retention.block_retention(bi, tpb);
            for beam in &mut beams {
                let block = self.get_free_block(r, now_ms);
                self.set_context_key(block, &src, bi, reusable, scratch);
                self.arena.add_refs(block, 1);
                beam.push(block);
            }
            self.stats.missed += 1;
        }
        if self.cfg.enable_reuse {
            // The keys stop before the last prompt token; the slot holds it too, so that the
            // blocks' slots spell the whole sequence (see `write_token`).
            let last = input_length - 1;
            for beam in &beams {
                self.tree.write_token(
                    beam[last / tpb],
                    last % tpb,
                    src.token_ids[last],
                    src.extra_ids.map(|e| e[last]),
                );
            }
        }
        self.seqs.insert(
            id,
            SeqBlocks {
                beams,
                front_removed: 0,
                detached_epochs: Vec::new(),
                slid_to: 0,
                lost_tokens: false,
                reuse: plan.reuse,
                suspended_at: None,
            },
        );
    }

    /// Gives a freshly allocated context block its key (when reuse is on).
    fn set_context_key(
        &mut self,
        block: u32,
        src: &KeySource<'_>,
        bi: usize,
        reusable: usize,
        scratch: &mut Vec<MmKey>,
    ) {
        let tpb = self.cfg.tokens_per_block;
        let start = bi * tpb;
        let end = ((bi + 1) * tpb).min(reusable);
        if !self.cfg.enable_reuse || start >= end {
            return;
        }
        let key = src.key(start, end, scratch);
        self.tree.set_key(block, &key);
    }

    fn claim_for_reuse(&mut self, block: u32, r: BlockRetention) {
        let old = self.queues.priority(block);
        self.queues.claim_with_retention(block, r);
        if let Some(new) = r.priority {
            self.record_priority_change(block, old, new);
        }
    }
}
