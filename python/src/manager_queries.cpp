// KVCacheManager methods: statistics and queries.
#include "manager.hpp"

namespace kvb_py {

void init_manager_queries(ManagerClass& cls) {
    cls.def(
           "get_kv_cache_stats",
           [](Manager& self) { return nogil([&] { return self.m.getKvCacheStats(); }); },
           "Whole-manager statistics (TensorRT-LLM ``getKvCacheStats``).")
        .def(
            "get_num_free_blocks",
            [](Manager& self) { return nogil([&] { return self.m.getNumFreeBlocks(); }); },
            "Free primary blocks over all windows (TensorRT-LLM ``getNumFreeBlocks``).")
        .def(
            "get_num_free_blocks_per_window_size",
            [](Manager& self, int32_t w) {
                return nogil([&] { return self.m.getNumFreeBlocksPerWindowSize(w); });
            },
            "window_size"_a, "``(primary, secondary)`` free blocks of a window.")
        .def(
            "get_request_stats",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getRequestStats(id); });
            },
            "request_id"_a, "The admission result of a live sequence.")
        .def(
            "get_num_tokens",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getNumTokens(id); });
            },
            "request_id"_a, "Tokens (prompt + generated) of a sequence.")
        .def_prop_ro(
            "tokens_per_block",
            [](Manager& self) {
                int32_t n = 0;
                call([&] { return kvb_manager_get_tokens_per_block(self.h(), &n); });
                return n;
            },
            "Tokens per block.")
        .def(
            "get_block_info",
            [](Manager& self, int32_t w, int32_t block) {
                return nogil([&] { return self.m.getBlockInfo(w, block); });
            },
            "window_size"_a, "block_id"_a, "A snapshot of one block of a window.")
        .def(
            "get_priority_by_block_id",
            [](Manager& self, int32_t w, int64_t block) {
                return nogil([&] { return self.m.getPriorityByBlockId(w, block); });
            },
            "window_size"_a, "block_id"_a,
            "Retention priority of a block (TensorRT-LLM ``getPriorityByBlockId``).")
        .def(
            "get_last_block_id",
            [](Manager& self, uint64_t id) {
                return nogil([&] { return self.m.getLastBlockId(id); });
            },
            "request_id"_a,
            "Last block of beam 0 in the smallest window (TensorRT-LLM ``getLastBlockId``).")
        .def(
            "offload_block",
            [](Manager& self, int32_t w, int32_t block) {
                return nogil([&] { return self.m.offloadBlock(w, block); });
            },
            "window_size"_a, "block_id"_a,
            "Offloads a primary block to the host tier (TensorRT-LLM ``offloadBlock``); a block "
            "sequences hold moves too and stays theirs, and their offsets are refused until "
            "``onboard_block`` brings it back. False when no host block is free, offloading is "
            "off or the block is on the host tier already; a pinned block raises "
            ":class:`InvalidArgumentError`.")
        .def(
            "onboard_block",
            [](Manager& self, int32_t w, int32_t block) {
                return nogil([&] { return self.m.onboardBlock(w, block); });
            },
            "window_size"_a, "block_id"_a,
            "Brings a host block back to the GPU tier (TensorRT-LLM ``onboardBlock``): a free "
            "cached block keeps its place in the reuse tree, a held block ``offload_block`` moved "
            "stays its sequences'. False when it does not move (already on the GPU, nothing "
            "cached, no free GPU block). A block a suspension moved raises "
            ":class:`InvalidArgumentError` (it comes back with ``resume``).")
        .def(
            "set_block_priority",
            [](Manager& self, int32_t w, int32_t block, int32_t priority) {
                nogil([&] { self.m.setBlockPriority(w, block, priority); });
            },
            "window_size"_a, "block_id"_a, "priority"_a,
            "Sets one block's retention priority, 0..100 (TensorRT-LLM "
            "``KVCacheBlock::setPriority``): a sequence's block is queued at it when released, a "
            "free block at once. Raises :class:`InvalidRetentionError` outside 0..100.")
        .def(
            "get_pool_pointer",
            [](Manager& self, int32_t w, kvb_cache_level_t level) {
                auto [base, row] = nogil([&] { return self.m.getPoolPointer(w, level); });
                return std::make_pair(reinterpret_cast<uintptr_t>(base), row);
            },
            "window_size"_a, "cache_level"_a,
            "``(address, row_bytes)`` of a window's pool: host memory (host backend) or the device "
            "address (CUDA backend); a block's row is its ``memory_index``.")
        .def("pool_view", &pool_view, "window_size"_a, "cache_level"_a = KVB_CACHE_LEVEL_PRIMARY,
             kPoolViewDoc)
        .def_prop_ro(
            "live_pool_views", [](const Manager& self) { return self.live_views; },
            "Pool views (:meth:`pool_view`) of this manager still alive.")
        .def(
            "set_stream",
            [](Manager& self, uintptr_t stream) {
                nogil([&] { self.m.setStream(reinterpret_cast<void*>(stream)); });
            },
            "stream"_a,
            "CUDA backend: orders later copies with the engine stream ``stream`` (an integer "
            "handle, "
            "e.g. ``torch.cuda.current_stream().cuda_stream``).")
        .def(
            "sync_transfers", [](Manager& self) { nogil([&] { self.m.syncTransfers(); }); },
            "CUDA copy-stream ordering: the engine stream waits (on the GPU) for every copy so "
            "far; "
            "a no-op otherwise.")
        .def(
            "register_pool",
            [](Manager& self, int32_t w, kvb_cache_level_t level, uintptr_t pointer,
               size_t nbytes) {
                nogil([&] {
                    self.m.registerPool(w, level, reinterpret_cast<void*>(pointer), nbytes);
                });
            },
            "window_size"_a, "cache_level"_a, "pointer"_a, "nbytes"_a,
            "CUDA backend: the engine's memory (an address, e.g. ``tensor.data_ptr()``) as the "
            "pool of "
            "a window and level; only before any data is held.")
        .def_prop_ro(
            "copy_launches", [](Manager& self) { return self.m.copyLaunches(); },
            "Batched copy submissions so far (CUDA kernel launches).");
}

}  // namespace kvb_py
