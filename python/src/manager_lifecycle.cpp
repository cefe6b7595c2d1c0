// KVCacheManager methods: generation and release.
#include "manager.hpp"

namespace kvb_py {

void init_manager_lifecycle(ManagerClass& cls) {
    cls.def(
           "add_token",
           [](Manager& self, uint64_t id, int32_t token) {
               nogil([&] { self.m.addToken(id, token); });
           },
           "request_id"_a, "token_id"_a,
           "Appends a generated token (TensorRT-LLM ``addToken``); allocates a block at block "
           "boundaries.")
        .def(
            "remove_token",
            [](Manager& self, uint64_t id) { nogil([&] { self.m.removeToken(id); }); },
            "request_id"_a, "Removes the last generated token (TensorRT-LLM ``removeToken``).")
        .def(
            "rewind_kv_cache",
            [](Manager& self, uint64_t id, int32_t n) {
                nogil([&] { self.m.rewindKVCache(id, n); });
            },
            "request_id"_a, "num_tokens"_a,
            "Removes the last ``num_tokens`` generated tokens (TensorRT-LLM ``rewindKVCache``).")
        .def(
            "store_context_blocks",
            [](Manager& self, uint64_t id, int32_t position) {
                nogil([&] { self.m.storeContextBlocks(id, position); });
            },
            "request_id"_a, "context_position"_a,
            "Stores the full prompt blocks computed so far for reuse, after a context chunk "
            "(TensorRT-LLM ``storeContextBlocks``).")
        .def(
            "store_new_block",
            [](Manager& self, uint64_t id) { nogil([&] { self.m.storeNewBlock(id); }); },
            "request_id"_a,
            "Stores the decode block the last token completed (TensorRT-LLM ``storeNewBlock``).")
        .def(
            "store_blocks_for_reuse",
            [](Manager& self, uint64_t id, bool pin, int32_t window_size) {
                // With pin, the first call (no room) only reports how many ids there will be.
                std::vector<int32_t> ids;
                size_t n = 0;
                kvb_status_t s = nogil([&] {
                    return kvb_manager_store_blocks_for_reuse(self.h(), id, pin, window_size,
                                                              nullptr, 0, &n);
                });
                if (pin && s == KVB_STATUS_BUFFER_TOO_SMALL) {
                    ids.resize(n);
                    s = nogil([&] {
                        return kvb_manager_store_blocks_for_reuse(self.h(), id, pin, window_size,
                                                                  ids.data(), ids.size(), &n);
                    });
                    ids.resize(n);
                }
                kvb::check(s);
                return ids;
            },
            "request_id"_a, "pin"_a = false, "window_size"_a = 0,
            "Stores every computed token of a sequence for reuse (TensorRT-LLM "
            "``storeBlocksForReuse``); with "
            "``pin``, pins the stored blocks and returns their ids in ``window_size`` (0 = the "
            "smallest window).")
        .def(
            "get_sequence_lengths",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getSequenceLengths(id); });
            },
            "request_id"_a, "The sequence's :class:`SequenceLengths`.")
        .def(
            "add_slot",
            [](Manager& self, uint64_t id) { return nogil([&] { return self.m.addSlot(id); }); },
            "request_id"_a,
            "Reserves one more slot without its token id (TensorRT-LLM ``addToken(requestId)``): "
            "first releases the blocks that left a sliding window of the new slot, then grows "
            "the capacity by one. Returns False, changing nothing, when the slot's block cannot "
            "be had.")
        .def(
            "resize",
            [](Manager& self, uint64_t id, size_t capacity) {
                return nogil([&] { return self.m.resize(id, capacity); });
            },
            "request_id"_a, "capacity"_a,
            "Resizes a sequence to ``capacity`` tokens. Returns False, changing nothing, when a "
            "grow cannot get its blocks; a shrink below the computed, committed or reused tokens "
            "raises :class:`InvalidArgumentError`.")
        .def(
            "allocate_generation",
            [](Manager& self, uint64_t id, size_t draft) {
                return nogil([&] { return self.m.allocateGeneration(id, draft); });
            },
            "request_id"_a, "num_draft_tokens"_a = 0,
            "Reserves KV slots for ``1 + num_draft_tokens`` tokens; False (nothing changed) when "
            "they cannot be had.")
        .def(
            "revert_allocate_generation",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.revertAllocateGeneration(id); });
            },
            "request_id"_a,
            "Undoes the last generation allocation (with its padding); False when there is none.")
        .def(
            "extend_capacity_for_tokens",
            [](Manager& self, uint64_t id, size_t n) {
                return nogil([&] { return self.m.extendCapacityForTokens(id, n); });
            },
            "request_id"_a, "num_tokens"_a,
            "Adds ``num_tokens`` padding slots to the generation allocation (CUDA-graph padding).")
        .def(
            "allocate_context",
            [](Manager& self, uint64_t id, size_t n) {
                return nogil([&] { return self.m.allocateContext(id, n); });
            },
            "request_id"_a, "num_tokens"_a,
            "Grows the capacity to the history plus ``num_tokens`` (a prefill chunk).")
        .def(
            "revert_allocate_context",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.revertAllocateContext(id); });
            },
            "request_id"_a,
            "Undoes the last context allocation of a deferred request (:class:`ContextRevert`).")
        .def(
            "advance_history",
            [](Manager& self, uint64_t id, size_t history) {
                nogil([&] { self.m.advanceHistory(id, history); });
            },
            "request_id"_a, "history"_a, "Marks ``history`` tokens as computed.")
        .def(
            "suspend", [](Manager& self, uint64_t id) { nogil([&] { self.m.suspend(id); }); },
            "request_id"_a,
            "Suspends a sequence: its blocks may move to the host tier when the GPU pool needs "
            "room.")
        .def(
            "resume",
            [](Manager& self, uint64_t id) { return nogil([&] { return self.m.resume(id); }); },
            "request_id"_a,
            "Brings a suspended sequence's blocks back to the GPU, all or none; False (nothing "
            "changed) above the utilization threshold or without room.")
        .def_prop_ro(
            "gpu_utilization",
            [](Manager& self) { return nogil([&] { return self.m.getGpuUtilization(); }); },
            "(total - free - movable) / total primary blocks, the maximum over windows.")
        .def(
            "end_scheduling_pass",
            [](Manager& self, size_t generation, size_t scheduled) {
                nogil([&] { self.m.endSchedulingPass(generation, scheduled); });
            },
            "num_generation_requests"_a, "num_scheduled"_a,
            "Ends a scheduling pass; raises :class:`StalledError` (naming the cause) after "
            "``stall_pass_threshold`` passes in a row without progress.")
        .def(
            "remove_sequence",
            [](Manager& self, uint64_t id, bool store) {
                nogil([&] { self.m.removeSequence(id, store); });
            },
            "request_id"_a, "store_for_reuse"_a = true,
            "Releases a finished sequence (TensorRT-LLM ``removeSequence``), first storing its "
            "computed blocks (up to its history: what ``store_context_blocks``, "
            "``advance_history`` or ``add_token`` reported) for reuse unless "
            "``store_for_reuse`` is False.")
        .def(
            "pin_blocks", [](Manager& self, uint64_t id) { nogil([&] { self.m.pinBlocks(id); }); },
            "request_id"_a, "Pins every block of a sequence (TensorRT-LLM ``pinBlocks``).")
        .def(
            "pin_blocks_by_id",
            [](Manager& self, int32_t window_size, const std::vector<int32_t>& ids) {
                nogil([&] { self.m.pinBlocksById(window_size, ids); });
            },
            "window_size"_a, "block_ids"_a,
            "Pins each listed GPU block (TensorRT-LLM ``WindowBlockManager::pinBlock``): it keeps "
            "its row and content until :meth:`unpin_blocks_by_id`. A host block or an id out of "
            "range raises :class:`InvalidArgumentError` and pins nothing.")
        .def(
            "copy_recurrent_state",
            [](Manager& self, const std::vector<uint64_t>& ids,
               const std::vector<int32_t>& positions) {
                return nogil([&] { return self.m.copyRecurrentState(ids, positions); });
            },
            "request_ids"_a, "positions"_a,
            "Carries each request's recurrent state into its next block where ``positions[i]`` "
            "(tokens processed) ends a block (TensorRT-LLM ``copyLinearAttentionBlock(Batch)``): "
            "the state pools' row of the finished block is copied into the next block's, in one "
            "submission; returns the block copies made.")
        .def(
            "unpin_blocks_by_id",
            [](Manager& self, int32_t window_size, const std::vector<int32_t>& ids) {
                nogil([&] { self.m.unpinBlocksById(window_size, ids); });
            },
            "window_size"_a, "block_ids"_a,
            "Drops one pin of each block (TensorRT-LLM ``unpinBlocksById``).");
}

}  // namespace kvb_py
