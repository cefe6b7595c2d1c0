//! The rules routers rely on, applied to kvblock's events before they go on the wire: one window
//! only, full blocks only (a trailing partial block is dropped from its Stored event and its later
//! Removed hash suppressed), Created and Updated not published. The reuse tree's blocks (GPU or
//! host: the manager onboards either at admission, and moves between them are Updated events,
//! not published) go out with `medium` "GPU". Disk-tier events go out with `medium` "DISK" only
//! when the publisher is asked to (`publish_disk_events`): a router that ignores `medium` would
//! otherwise take a block on disk for one on the GPU, and a disk removal for a GPU removal.

use std::collections::HashSet;

use super::wire::{MEDIUM, MEDIUM_DISK};
use crate::events::{EventData, KvCacheEvent};

/// An event in the vLLM / Dynamo wire schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireEvent {
    /// `BlockStored`: a chain of full blocks; `token_ids` holds every block's tokens in order.
    Stored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<i32>,
        block_size: usize,
        lora_id: Option<u64>,
        /// Where the blocks live: `MEDIUM` ("GPU") or `MEDIUM_DISK` ("DISK").
        medium: &'static str,
    },
    /// `BlockRemoved`.
    Removed {
        block_hashes: Vec<u64>,
        medium: &'static str,
    },
    /// `AllBlocksCleared`.
    AllBlocksCleared,
}

/// Turns one window's events into wire events; keeps the hashes it withheld.
#[derive(Debug)]
pub struct WireFilter {
    window_size: usize,
    tokens_per_block: usize,
    /// Blocks never published (partial, or chained below one): their removals are suppressed.
    withheld: HashSet<u64>,
    /// Whether disk-tier events are published (medium "DISK").
    publish_disk: bool,
    /// Disk blocks never published (partial): their removals are suppressed.
    withheld_disk: HashSet<u64>,
}

impl WireFilter {
    pub fn new(window_size: usize, tokens_per_block: usize) -> Self {
        WireFilter {
            window_size,
            tokens_per_block,
            withheld: HashSet::new(),
            publish_disk: false,
            withheld_disk: HashSet::new(),
        }
    }

    /// Also publishes the disk tier's events, with `medium` "DISK".
    pub fn with_disk_events(mut self, publish: bool) -> Self {
        self.publish_disk = publish;
        self
    }

    /// Hashes withheld and not yet removed.
    pub fn num_withheld(&self) -> usize {
        self.withheld.len() + self.withheld_disk.len()
    }

    /// The wire events of one flushed iteration, in order (possibly none).
    pub fn translate(&mut self, events: &[KvCacheEvent]) -> Vec<WireEvent> {
        let mut out = Vec::new();
        for e in events.iter().filter(|e| e.window_size == self.window_size) {
            match &e.data {
                EventData::Stored {
                    parent_hash,
                    blocks,
                } => {
                    // A chain under a withheld parent cannot be placed by a router either.
                    let mut publish = !parent_hash.is_some_and(|p| self.withheld.contains(&p));
                    let mut block_hashes = Vec::new();
                    let mut token_ids = Vec::new();
                    for b in blocks {
                        publish &= b.token_ids.len() == self.tokens_per_block;
                        if publish {
                            block_hashes.push(b.hash);
                            token_ids.extend_from_slice(&b.token_ids);
                        } else {
                            self.withheld.insert(b.hash);
                        }
                    }
                    if !block_hashes.is_empty() {
                        out.push(WireEvent::Stored {
                            block_hashes,
                            parent_block_hash: *parent_hash,
                            token_ids,
                            block_size: self.tokens_per_block,
                            lora_id: blocks[0].lora_task_id,
                            medium: MEDIUM,
                        });
                    }
                }
                EventData::DiskStored {
                    parent_hash,
                    blocks,
                } if self.publish_disk => {
                    // One block per event; its parent may live at another level (a router
                    // indexing disk blocks by hash does not need it there).
                    for b in blocks {
                        if b.token_ids.len() != self.tokens_per_block {
                            self.withheld_disk.insert(b.hash);
                            continue;
                        }
                        out.push(WireEvent::Stored {
                            block_hashes: vec![b.hash],
                            parent_block_hash: *parent_hash,
                            token_ids: b.token_ids.clone(),
                            block_size: self.tokens_per_block,
                            lora_id: b.lora_task_id,
                            medium: MEDIUM_DISK,
                        });
                    }
                }
                EventData::DiskRemoved { block_hashes } if self.publish_disk => {
                    let kept: Vec<u64> = block_hashes
                        .iter()
                        .copied()
                        .filter(|h| !self.withheld_disk.remove(h))
                        .collect();
                    if !kept.is_empty() {
                        out.push(WireEvent::Removed {
                            block_hashes: kept,
                            medium: MEDIUM_DISK,
                        });
                    }
                }
                EventData::Removed { block_hashes } => {
                    let kept: Vec<u64> = block_hashes
                        .iter()
                        .copied()
                        .filter(|h| !self.withheld.remove(h))
                        .collect();
                    if !kept.is_empty() {
                        out.push(WireEvent::Removed {
                            block_hashes: kept,
                            medium: MEDIUM,
                        });
                    }
                }
                EventData::Created { .. }
                | EventData::Updated { .. }
                | EventData::DiskStored { .. }
                | EventData::DiskRemoved { .. } => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::StoredBlock;
    use crate::pool::Level;

    fn block(hash: u64, tokens: usize) -> StoredBlock {
        StoredBlock {
            hash,
            token_ids: (0..tokens as i32).collect(),
            extra_ids: None,
            lora_task_id: None,
            cache_level: Level::Primary,
            priority: 35,
            mm_keys: Vec::new(),
            cache_salt: None,
        }
    }

    fn ev(window_size: usize, data: EventData) -> KvCacheEvent {
        KvCacheEvent {
            event_id: 0,
            window_size,
            attention_dp_rank: None,
            data,
        }
    }

    fn stored(window: usize, parent: Option<u64>, blocks: Vec<StoredBlock>) -> KvCacheEvent {
        ev(
            window,
            EventData::Stored {
                parent_hash: parent,
                blocks,
            },
        )
    }

    fn removed(window: usize, hashes: &[u64]) -> KvCacheEvent {
        ev(
            window,
            EventData::Removed {
                block_hashes: hashes.to_vec(),
            },
        )
    }

    #[test]
    fn trailing_partial_block_is_dropped_and_its_removal_suppressed() {
        let mut f = WireFilter::new(64, 4);
        let out = f.translate(&[stored(
            64,
            Some(7),
            vec![block(1, 4), block(2, 4), block(3, 2)],
        )]);
        assert_eq!(
            out,
            vec![WireEvent::Stored {
                block_hashes: vec![1, 2],
                parent_block_hash: Some(7),
                token_ids: vec![0, 1, 2, 3, 0, 1, 2, 3],
                block_size: 4,
                lora_id: None,
                medium: MEDIUM,
            }]
        );
        assert_eq!(f.num_withheld(), 1);
        let out = f.translate(&[removed(64, &[3, 2])]);
        assert_eq!(
            out,
            vec![WireEvent::Removed {
                block_hashes: vec![2],
                medium: MEDIUM,
            }]
        );
        assert_eq!(f.num_withheld(), 0);
        // Only the partial block's removal: nothing to publish.
        f.translate(&[stored(64, None, vec![block(9, 1)])]);
        assert!(f.translate(&[removed(64, &[9])]).is_empty());
    }

    #[test]
    fn chains_under_a_withheld_block_are_withheld_too() {
        let mut f = WireFilter::new(64, 4);
        assert!(f
            .translate(&[stored(64, None, vec![block(1, 3)])])
            .is_empty());
        assert!(f
            .translate(&[stored(64, Some(1), vec![block(2, 4)])])
            .is_empty());
        assert!(f.translate(&[removed(64, &[1, 2])]).is_empty());
    }

    #[test]
    fn other_windows_and_created_updated_are_not_published() {
        let mut f = WireFilter::new(64, 4);
        let out = f.translate(&[
            ev(
                64,
                EventData::Created {
                    num_blocks_per_cache_level: [8, 0],
                },
            ),
            stored(16, None, vec![block(1, 4)]),
            removed(16, &[1]),
            ev(
                64,
                EventData::Updated {
                    block_hash: 5,
                    cache_level: Some((Level::Primary, Level::Secondary)),
                    priority: None,
                },
            ),
        ]);
        assert!(out.is_empty());
    }

    fn disk_stored(parent: Option<u64>, b: StoredBlock) -> KvCacheEvent {
        ev(
            64,
            EventData::DiskStored {
                parent_hash: parent,
                blocks: vec![b],
            },
        )
    }

    #[test]
    fn disk_events_are_published_with_medium_disk_only_when_asked() {
        let events = [
            disk_stored(Some(7), block(1, 4)),
            disk_stored(Some(1), block(2, 3)),
            ev(
                64,
                EventData::DiskRemoved {
                    block_hashes: vec![1, 2],
                },
            ),
        ];
        assert!(WireFilter::new(64, 4).translate(&events).is_empty());
        let mut f = WireFilter::new(64, 4).with_disk_events(true);
        let out = f.translate(&events);
        assert_eq!(
            out,
            vec![
                WireEvent::Stored {
                    block_hashes: vec![1],
                    parent_block_hash: Some(7),
                    token_ids: vec![0, 1, 2, 3],
                    block_size: 4,
                    lora_id: None,
                    medium: MEDIUM_DISK,
                },
                // The partial block 2 is neither stored nor removed.
                WireEvent::Removed {
                    block_hashes: vec![1],
                    medium: MEDIUM_DISK,
                },
            ]
        );
        assert_eq!(f.num_withheld(), 0);
    }
}
