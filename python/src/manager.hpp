// The KVCacheManager object and what its binding files share.
#pragma once

#include "common.hpp"

namespace kvb_py {

/// Int32 offset table of a C call: a C-contiguous writable int32 CPU array, else ValueError.
using TableArray = nb::ndarray<int32_t, nb::c_contig, nb::device::cpu>;

struct Manager {
    kvb::Manager m;
    kvb::Config config;  // the pool geometry of pool_view (the C ABI has no config getter)
    int live_views = 0;  // pool views alive (changed with the GIL held); close() refuses while > 0

    explicit Manager(const kvb::Config& c) : m(c), config(c) {}

    kvb_manager_t* h() const { return m.get(); }

    /// Destroys the handle now (later calls raise DestroyedError; a waiting drain returns).
    void close() {
        if (live_views > 0) {
            invalid_argument(std::to_string(live_views) +
                             " pool view(s) of this manager are alive; they read its pools, "
                             "which close() would free: delete them first");
        }
        // The wrapper's destructor destroys again later, which the library answers with a status.
        call([&] { return kvb_manager_destroy(h()); });
    }

    std::pair<int32_t, int32_t> dims() const {
        return nogil([&] { return m.getOffsetTableDimensions(); });
    }

    /// Checks `output` against [num_pools][num_slots][2][max_blocks_per_seq]; returns num_slots.
    TableArray table_of(nb::handle output) const {
        TableArray table;
        auto [max_blocks, pools] = dims();
        const std::string want = "a writable C-contiguous int32 CPU array of shape (" +
                                 std::to_string(pools) + ", num_slots, 2, " +
                                 std::to_string(max_blocks) + ")";
        if (!nb::try_cast(output, table, /*convert=*/false)) {
            throw nb::value_error(
                ("output must be " + want + ", got " + std::string(nb::repr(output.type()).c_str()))
                    .c_str());
        }
        if (table.ndim() != 4 || table.shape(0) != static_cast<size_t>(pools) ||
            table.shape(2) != 2 || table.shape(3) != static_cast<size_t>(max_blocks)) {
            std::string got = "(";
            for (size_t i = 0; i < table.ndim(); ++i)
                got += (i ? ", " : "") + std::to_string(table.shape(i));
            throw nb::value_error(("output must be " + want + ", got shape " + got + ")").c_str());
        }
        return table;
    }
};

using ManagerClass = nb::class_<Manager>;

/// Zero-copy view of a pool (pool_view.cpp).
nb::object pool_view(nb::handle self_obj, int32_t window, kvb_cache_level_t level);
extern const char* const kPoolViewDoc;
/// A zero-copy view of pool memory at `base` owned by the manager object (pool_view.cpp).
nb::object wrap_pool_memory(nb::handle self_obj, void* base, const std::vector<size_t>& shape,
                            nb::dlpack::dtype dtype, kvb_cache_level_t level);

// The KVCacheManager methods, one file per subsystem (manager_*.cpp).
void init_manager_admission(ManagerClass& cls);
void init_manager_lifecycle(ManagerClass& cls);
void init_manager_tables(ManagerClass& cls);
void init_manager_queries(ManagerClass& cls);
void init_manager_remote(ManagerClass& cls);
void init_manager_scheduling(ManagerClass& cls);
void init_manager_iteration(ManagerClass& cls);
void init_manager_reuse_tree(nb::module_& m, ManagerClass& cls);
void init_sizing(ManagerClass& cls);
void init_manager_disk(ManagerClass& cls);
void init_manager_pools(ManagerClass& cls);
void init_manager_disagg(ManagerClass& cls);

}  // namespace kvb_py
