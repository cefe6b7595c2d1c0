// KVCacheManager methods: block tables.
#include "manager.hpp"

namespace kvb_py {

void init_manager_tables(ManagerClass& cls) {
    cls.def(
           "get_cache_block_ids",
           [](Manager& self, uint64_t id, int32_t window_size, int32_t beam) {
               return nogil([&] { return self.m.getCacheBlockIds(id, window_size, beam); });
           },
           "request_id"_a, "window_size"_a, "beam"_a = 0,
           "Block ids of one beam of a sequence in one window (TensorRT-LLM "
           "``getCacheBlockIds``).")
        .def("get_offset_table_dimensions", &Manager::dims,
             "``(max_blocks_per_seq, num_pools)`` of an offset table "
             "``[num_pools][num_slots][2][max_blocks_per_seq]``.")
        .def(
            "get_max_blocks_per_seq",
            [](Manager& self, int32_t w) {
                return nogil([&] { return self.m.getMaxBlocksPerSeq(w); });
            },
            "window_size"_a,
            "The most blocks one beam may list in a window: ``ceil((min(max_sequence_length, "
            "window limit) + num_extra_kv_tokens + max_draft_tokens) / tokens_per_block)``.")
        .def(
            "get_host_tier_blocks",
            [](Manager& self, int32_t w) {
                return nogil([&] { return self.m.getHostTierBlocks(w); });
            },
            "window_size"_a,
            "Host-tier blocks of a window: configured, or chosen for an automatic host tier.")
        .def(
            "copy_block_offsets",
            [](Manager& self, nb::handle output, int32_t output_slot_offset, uint64_t request_id) {
                TableArray table = self.table_of(output);
                int32_t count = 0;
                call([&] {
                    return kvb_manager_copy_block_offsets(self.h(), table.data(), table.size(),
                                                          static_cast<int32_t>(table.shape(1)),
                                                          output_slot_offset, request_id, &count);
                });
                return count;
            },
            "output"_a, "output_slot_offset"_a, "request_id"_a,
            "Writes a sequence's block offsets into ``output`` (int32, shape ``(num_pools, "
            "num_slots, 2, "
            "max_blocks_per_seq)``; numpy or any DLPack CPU tensor, written in place) at slots "
            "``output_slot_offset ..`` (TensorRT-LLM ``copyBlockOffsets``). Returns the most "
            "blocks of any "
            "beam. A wrong dtype, layout or shape raises ValueError.")
        .def(
            "get_block_offsets_of_batch",
            [](Manager& self, const std::vector<uint64_t>& request_ids, int32_t beam_width,
               nb::object output) {
                if (output.is_none()) {
                    auto [max_blocks, pools] = self.dims();
                    output = nb::cast(
                        new_int32_array({static_cast<size_t>(pools),
                                         request_ids.size() * static_cast<size_t>(beam_width), 2,
                                         static_cast<size_t>(max_blocks)}));
                }
                TableArray table = self.table_of(output);
                call([&] {
                    return kvb_manager_get_block_offsets_of_batch(
                        self.h(), table.data(), table.size(), static_cast<int32_t>(table.shape(1)),
                        request_ids.data(), request_ids.size(), beam_width);
                });
                return output;
            },
            "request_ids"_a, "beam_width"_a = 1, "output"_a = nb::none(),
            "Offsets of a batch (TensorRT-LLM ``getBlockOffsetsOfBatch``): request "
            "``request_ids[i]`` at "
            "slots ``i * beam_width ..``. Writes into ``output`` (as in "
            ":meth:`copy_block_offsets`) or a new "
            "numpy array of ``len(request_ids) * beam_width`` slots, and returns it.");
}

}  // namespace kvb_py
