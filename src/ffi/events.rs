//! C entry points of KV cache events: flush, a blocking drain that runs concurrently with the
//! executor, and an opaque batch with accessors whose views live until the batch is freed.

use std::time::Duration;

use super::handle::{
    guard, invalid, kvb_manager_t, live_delivery, null_error, require_out, with_manager, write_out,
    FfiResult,
};
use super::status::kvb_status_t;
use super::types::kvb_cache_level_t;
use crate::events::{EventData, KvCacheEvent};

/// Type of an event (values of `kvb_event_t::event_type`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum kvb_event_type_t {
    /// A window was created (`num_primary_blocks`, `num_secondary_blocks`).
    KVB_EVENT_CREATED = 0,
    /// A chain of blocks entered the reuse tree (`parent_hash`, `num_stored_blocks`; read the
    /// blocks with `kvb_event_batch_get_stored_block`). With `disk_tier` set: one block became
    /// readable on the disk tier (its write completed); its `cache_level` is
    /// `KVB_CACHE_LEVEL_DISK` and its hash and parent hash are those it had in the tree.
    KVB_EVENT_STORED = 1,
    /// Blocks left the reuse tree (`removed_hashes`). Every block that leaves is reported:
    /// evicted, detached with an evicted ancestor, or taken over after a partial match. A block
    /// the host tier evicts to disk is Removed here, then Stored with `disk_tier` set once its
    /// write completes; one read back from disk is Stored again at the host level. With
    /// `disk_tier` set: the blocks left the disk tier (their slots were evicted or dropped).
    KVB_EVENT_REMOVED = 2,
    /// A block in the tree changed cache level and/or priority (`block_hash`, old/new values).
    KVB_EVENT_UPDATED = 3,
}

/// A multimodal key of a stored block.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_mm_key_t {
    /// Hash of the multimodal item's content (`kvb_multimodal_item_t::digest`).
    pub digest: [u8; 32],
    /// Where the item starts relative to the block (0 when it starts inside the block).
    pub start_offset: i32,
}

/// One block of a Stored event. Pointers stay valid until the batch is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_stored_block_t {
    /// TensorRT-LLM block hash.
    pub block_hash: u64,
    /// The block's `num_tokens` token ids.
    pub tokens: *const i32,
    /// Per-token extra ids, or null when the request had none.
    pub token_extra_ids: *const u64,
    /// Tokens of the block (at most `tokens_per_block`; fewer for a partial block).
    pub num_tokens: usize,
    /// Whether `lora_task_id` is set.
    pub has_lora_task_id: bool,
    /// LoRA task id of the block's key (0 when `has_lora_task_id` is false).
    pub lora_task_id: u64,
    /// A `kvb_cache_level_t` value.
    pub cache_level: i32,
    /// Retention priority, 0..=100.
    pub priority: i32,
    /// Array of `num_mm_keys` multimodal keys, or null when there are none.
    pub mm_keys: *const kvb_mm_key_t,
    /// Entries of `mm_keys`.
    pub num_mm_keys: usize,
    /// Whether `cache_salt` is set.
    pub has_cache_salt: bool,
    /// Cache salt of the block's key (0 when `has_cache_salt` is false).
    pub cache_salt: u64,
}

/// One event. Fields not of its type are zero. Pointers stay valid until the batch is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kvb_event_t {
    /// Strictly increasing in delivery order.
    pub event_id: u64,
    /// A `kvb_event_type_t` value.
    pub event_type: i32,
    /// Attention window the event is about.
    pub window_size: i32,
    /// Whether `attention_dp_rank` is set (the config's `attention_dp_rank` is not -1).
    pub has_attention_dp_rank: bool,
    /// The config's attention data-parallel rank (0 when `has_attention_dp_rank` is false).
    pub attention_dp_rank: i32,
    /// Created: the window's primary blocks.
    pub num_primary_blocks: i32,
    /// Created: the window's secondary blocks.
    pub num_secondary_blocks: i32,
    /// Stored: the first block's tree parent (none = the root).
    pub has_parent_hash: bool,
    /// Stored: the parent's block hash (0 when `has_parent_hash` is false).
    pub parent_hash: u64,
    /// Stored: blocks in the chain, parent to child (read them with
    /// `kvb_event_batch_get_stored_block`).
    pub num_stored_blocks: usize,
    /// Removed: the hashes of the blocks that left the tree.
    pub removed_hashes: *const u64,
    /// Removed: entries of `removed_hashes`.
    pub num_removed_hashes: usize,
    /// Updated: the hash of the block that changed.
    pub block_hash: u64,
    /// Updated: whether the cache level changed (`old_cache_level`, `new_cache_level`).
    pub has_cache_level_change: bool,
    /// Updated: the previous `kvb_cache_level_t` value.
    pub old_cache_level: i32,
    /// Updated: the new `kvb_cache_level_t` value.
    pub new_cache_level: i32,
    /// Updated: whether the priority changed (`old_priority`, `new_priority`).
    pub has_priority_change: bool,
    /// Updated: the previous retention priority.
    pub old_priority: i32,
    /// Updated: the new retention priority.
    pub new_priority: i32,
    /// Stored / Removed: the event is about the disk tier (`KVB_CACHE_LEVEL_DISK`), not the
    /// reuse tree. Disk slots recovered at a restart are not announced, nor is their removal.
    pub disk_tier: bool,
}

/// A drained batch of events. Free with `kvb_event_batch_free`.
pub struct kvb_event_batch_t {
    events: Vec<KvCacheEvent>,
    views: Vec<kvb_event_t>,
    stored: Vec<Vec<kvb_stored_block_t>>,
    mm_keys: Vec<Vec<Vec<kvb_mm_key_t>>>,
    dropped: u64,
}

fn build_batch(events: Vec<KvCacheEvent>, dropped: u64) -> Box<kvb_event_batch_t> {
    let mut batch = Box::new(kvb_event_batch_t {
        views: Vec::with_capacity(events.len()),
        stored: Vec::with_capacity(events.len()),
        mm_keys: Vec::with_capacity(events.len()),
        events,
        dropped,
    });
    // Views point into `batch.events` and `batch.mm_keys`, which are not modified afterwards
    // (the outer vectors are filled before any pointer into their elements is taken).
    for e in &batch.events {
        let keys: Vec<Vec<kvb_mm_key_t>> = match &e.data {
            EventData::Stored { blocks, .. } | EventData::DiskStored { blocks, .. } => blocks
                .iter()
                .map(|b| {
                    b.mm_keys
                        .iter()
                        .map(|k| kvb_mm_key_t {
                            digest: k.digest,
                            start_offset: k.start_offset,
                        })
                        .collect()
                })
                .collect(),
            _ => Vec::new(),
        };
        batch.mm_keys.push(keys);
    }
    for (i, e) in batch.events.iter().enumerate() {
        let mut v = kvb_event_t {
            event_id: e.event_id,
            event_type: 0,
            window_size: e.window_size as i32,
            has_attention_dp_rank: e.attention_dp_rank.is_some(),
            attention_dp_rank: e.attention_dp_rank.unwrap_or(0),
            num_primary_blocks: 0,
            num_secondary_blocks: 0,
            has_parent_hash: false,
            parent_hash: 0,
            num_stored_blocks: 0,
            removed_hashes: std::ptr::null(),
            num_removed_hashes: 0,
            block_hash: 0,
            has_cache_level_change: false,
            old_cache_level: 0,
            new_cache_level: 0,
            has_priority_change: false,
            old_priority: 0,
            new_priority: 0,
            disk_tier: false,
        };
        let mut stored = Vec::new();
        match &e.data {
            EventData::Created {
                num_blocks_per_cache_level,
            } => {
                v.event_type = kvb_event_type_t::KVB_EVENT_CREATED as i32;
                v.num_primary_blocks = num_blocks_per_cache_level[0] as i32;
                v.num_secondary_blocks = num_blocks_per_cache_level[1] as i32;
            }
            EventData::Stored {
                parent_hash,
                blocks,
            }
            | EventData::DiskStored {
                parent_hash,
                blocks,
            } => {
                v.event_type = kvb_event_type_t::KVB_EVENT_STORED as i32;
                v.disk_tier = matches!(e.data, EventData::DiskStored { .. });
                v.has_parent_hash = parent_hash.is_some();
                v.parent_hash = parent_hash.unwrap_or(0);
                v.num_stored_blocks = blocks.len();
                for (j, b) in blocks.iter().enumerate() {
                    let keys = &batch.mm_keys[i][j];
                    stored.push(kvb_stored_block_t {
                        block_hash: b.hash,
                        tokens: b.token_ids.as_ptr(),
                        token_extra_ids: b
                            .extra_ids
                            .as_ref()
                            .map_or(std::ptr::null(), |x| x.as_ptr()),
                        num_tokens: b.token_ids.len(),
                        has_lora_task_id: b.lora_task_id.is_some(),
                        lora_task_id: b.lora_task_id.unwrap_or(0),
                        cache_level: if v.disk_tier {
                            kvb_cache_level_t::KVB_CACHE_LEVEL_DISK as i32
                        } else {
                            b.cache_level as i32
                        },
                        priority: i32::from(b.priority),
                        mm_keys: if keys.is_empty() {
                            std::ptr::null()
                        } else {
                            keys.as_ptr()
                        },
                        num_mm_keys: keys.len(),
                        has_cache_salt: b.cache_salt.is_some(),
                        cache_salt: b.cache_salt.unwrap_or(0),
                    });
                }
            }
            EventData::Removed { block_hashes } | EventData::DiskRemoved { block_hashes } => {
                v.event_type = kvb_event_type_t::KVB_EVENT_REMOVED as i32;
                v.disk_tier = matches!(e.data, EventData::DiskRemoved { .. });
                v.removed_hashes = block_hashes.as_ptr();
                v.num_removed_hashes = block_hashes.len();
            }
            EventData::Updated {
                block_hash,
                cache_level,
                priority,
            } => {
                v.event_type = kvb_event_type_t::KVB_EVENT_UPDATED as i32;
                v.block_hash = *block_hash;
                if let Some((old, new)) = cache_level {
                    v.has_cache_level_change = true;
                    v.old_cache_level = *old as i32;
                    v.new_cache_level = *new as i32;
                }
                if let Some((old, new)) = priority {
                    v.has_priority_change = true;
                    v.old_priority = i32::from(*old);
                    v.new_priority = i32::from(*new);
                }
            }
        }
        batch.views.push(v);
        batch.stored.push(stored);
    }
    batch
}

fn batch_ref<'a>(batch: *const kvb_event_batch_t) -> FfiResult<&'a kvb_event_batch_t> {
    // SAFETY: a batch from kvb_manager_get_latest_events, not yet freed (caller contract).
    unsafe { batch.as_ref() }.ok_or_else(|| null_error("batch"))
}

/// Ends the iteration's events (TensorRT-LLM `flushIterationEvents`): commits every window's
/// pending removals and makes the iteration's events visible to `kvb_manager_get_latest_events`.
/// Call once per iteration. A no-op when events are off.
#[no_mangle]
pub extern "C" fn kvb_manager_flush_iteration_events(manager: *mut kvb_manager_t) -> kvb_status_t {
    with_manager(manager, |m| {
        m.flush_iteration_events();
        Ok(())
    })
}

/// Takes every flushed event, waiting up to `timeout_ms` (0 = do not wait) for at least one.
/// Safe to call from another thread while the executor keeps using the manager: it does not
/// take the manager's lock while waiting. `*out_batch` receives a batch (possibly empty) to free
/// with `kvb_event_batch_free`. Returns at once with an empty batch when events are off. A drain
/// waiting when the manager is destroyed returns `KVB_OK` with an empty batch; one started after
/// returns `KVB_STATUS_DESTROYED`.
#[no_mangle]
pub extern "C" fn kvb_manager_get_latest_events(
    manager: *mut kvb_manager_t,
    timeout_ms: i64,
    out_batch: *mut *mut kvb_event_batch_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out_batch, "out_batch")?;
        write_out(out_batch, std::ptr::null_mut(), "out_batch")?;
        let timeout = u64::try_from(timeout_ms)
            .map_err(|_| invalid(format!("timeout_ms is negative ({timeout_ms})")))?;
        let delivery = live_delivery(manager)?;
        let drained = delivery.drain(Duration::from_millis(timeout));
        let batch = build_batch(drained.events, drained.dropped);
        write_out(out_batch, Box::into_raw(batch), "out_batch")
    })
}

/// Number of events in a batch.
#[no_mangle]
pub extern "C" fn kvb_event_batch_size(
    batch: *const kvb_event_batch_t,
    out: *mut usize,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        write_out(out, batch_ref(batch)?.views.len(), "out")
    })
}

/// Events dropped because the buffer was full since the previous drain.
#[no_mangle]
pub extern "C" fn kvb_event_batch_num_dropped(
    batch: *const kvb_event_batch_t,
    out: *mut u64,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        write_out(out, batch_ref(batch)?.dropped, "out")
    })
}

/// Event `index` of a batch (views valid until the batch is freed).
#[no_mangle]
pub extern "C" fn kvb_event_batch_get(
    batch: *const kvb_event_batch_t,
    index: usize,
    out: *mut kvb_event_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        let b = batch_ref(batch)?;
        let v = b.views.get(index).ok_or_else(|| {
            invalid(format!(
                "event index {index} out of range (batch of {})",
                b.views.len()
            ))
        })?;
        write_out(out, *v, "out")
    })
}

/// Block `block_index` of Stored event `event_index`.
#[no_mangle]
pub extern "C" fn kvb_event_batch_get_stored_block(
    batch: *const kvb_event_batch_t,
    event_index: usize,
    block_index: usize,
    out: *mut kvb_stored_block_t,
) -> kvb_status_t {
    guard(|| {
        require_out(out, "out")?;
        let b = batch_ref(batch)?;
        let blocks = b.stored.get(event_index).ok_or_else(|| {
            invalid(format!(
                "event index {event_index} out of range (batch of {})",
                b.views.len()
            ))
        })?;
        let block = blocks.get(block_index).ok_or_else(|| {
            invalid(format!(
                "block index {block_index} out of range (event {event_index} has {} stored blocks)",
                blocks.len()
            ))
        })?;
        write_out(out, *block, "out")
    })
}

/// Frees a batch; null is accepted.
#[no_mangle]
pub extern "C" fn kvb_event_batch_free(batch: *mut kvb_event_batch_t) -> kvb_status_t {
    guard(|| {
        if !batch.is_null() {
            // SAFETY: a batch from kvb_manager_get_latest_events, freed once (caller contract).
            drop(unsafe { Box::from_raw(batch) });
        }
        Ok(())
    })
}
