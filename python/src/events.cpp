// KV cache events as Python objects.
#include "init.hpp"

namespace kvb_py {

void init_events(nb::module_& m) {
    using Event = kvb::Event;
    auto diff = nb::class_<Event::Diff>(m, "KVCacheEventDiff", "An old and a new value.")
                    .def_ro("old_value", &Event::Diff::oldValue)
                    .def_ro("new_value", &Event::Diff::newValue);
    add_repr(diff, "KVCacheEventDiff", {"old_value", "new_value"});

    auto key = nb::class_<Event::MmKey>(m, "MmKey", "A multimodal key of a stored block.")
                   .def_prop_ro("digest",
                                [](const Event::MmKey& k) {
                                    return nb::bytes(reinterpret_cast<const char*>(k.digest.data()),
                                                     k.digest.size());
                                })
                   .def_ro("start_offset", &Event::MmKey::startOffset,
                           "Where the item starts relative to the block.");
    add_repr(key, "MmKey", {"digest", "start_offset"});

    auto block =
        nb::class_<Event::StoredBlock>(m, "KVCacheStoredBlock", "One block of a Stored event.")
            .def_ro("block_hash", &Event::StoredBlock::hash, "TensorRT-LLM block hash.")
            .def_ro("tokens", &Event::StoredBlock::tokens)
            .def_ro("token_extra_ids", &Event::StoredBlock::extraIds,
                    "Per-token extra ids, or None.")
            .def_ro("lora_task_id", &Event::StoredBlock::loraTaskId)
            .def_ro("cache_level", &Event::StoredBlock::cacheLevel)
            .def_ro("priority", &Event::StoredBlock::priority)
            .def_ro("mm_keys", &Event::StoredBlock::mmKeys)
            .def_ro("cache_salt", &Event::StoredBlock::cacheSalt);
    add_repr(block, "KVCacheStoredBlock",
             {"block_hash", "tokens", "token_extra_ids", "lora_task_id", "cache_level", "priority",
              "mm_keys", "cache_salt"});

    auto event =
        nb::class_<Event>(m, "KVCacheEvent",
                          "One KV cache event (``kvb_event_t``). Only the fields of its "
                          "``event_type`` are set; the others "
                          "are empty or zero.")
            .def_ro("event_id", &Event::id, "Strictly increasing in delivery order.")
            .def_ro("event_type", &Event::type)
            .def_ro("window_size", &Event::windowSize)
            .def_ro("attention_dp_rank", &Event::attentionDpRank)
            .def_ro("num_primary_blocks", &Event::numPrimaryBlocks,
                    "Created: GPU blocks of the window.")
            .def_ro("num_secondary_blocks", &Event::numSecondaryBlocks,
                    "Created: host blocks of the window.")
            .def_ro("parent_hash", &Event::parentHash,
                    "Stored: the first block's tree parent (None = the root).")
            .def_ro("stored_blocks", &Event::storedBlocks,
                    "Stored: the blocks, each the parent of the next.")
            .def_ro("removed_hashes", &Event::removedHashes,
                    "Removed: hashes of the blocks that left the tree.")
            .def_ro("block_hash", &Event::blockHash, "Updated: the block.")
            .def_ro("cache_level", &Event::cacheLevel, "Updated: the cache level change, or None.")
            .def_ro("priority", &Event::priority, "Updated: the priority change, or None.")
            .def_ro("disk_tier", &Event::diskTier,
                    "Stored / Removed: the event is about the disk tier (CacheLevel.DISK), not "
                    "the reuse tree.");
    add_repr(event, "KVCacheEvent",
             {"event_id", "event_type", "window_size", "attention_dp_rank", "num_primary_blocks",
              "num_secondary_blocks", "parent_hash", "stored_blocks", "removed_hashes",
              "block_hash", "cache_level", "priority", "disk_tier"});
}

}  // namespace kvb_py
