// kvblock/config.hpp: kvb::Config, a manager's configuration, and the sizing helpers.
// Part of the C++ wrapper; include kvblock.hpp, which includes every part.
#ifndef KVBLOCK_CONFIG_HPP
#define KVBLOCK_CONFIG_HPP

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../kvblock.h"
#include "error.hpp"

namespace kvb {

/// A window's disk tier sized for a byte budget (kvb_calculate_disk_tier_blocks).
struct DiskTierSize {
    int64_t blocks;      ///< blocks (slots) `diskBytes` holds
    uint64_t slotBytes;  ///< bytes one block takes on disk: its row behind a header, 4 KiB-aligned
};
/// The blocks a disk budget holds for rows of `rowBytes` (every pool of the window) in blocks
/// of `tokensPerBlock` tokens: what `withDiskTier(dir, diskBytes)` gives the window.
inline DiskTierSize calculateDiskTierBlocks(int32_t tokensPerBlock, uint64_t rowBytes,
                                            uint64_t diskBytes) {
    DiskTierSize out{};
    check(kvb_calculate_disk_tier_blocks(tokensPerBlock, rowBytes, diskBytes, &out.blocks,
                                         &out.slotBytes));
    return out;
}

/// GPU and host byte budgets of a KV cache on `cudaDevice` (kvb_calculate_free_mem_bytes,
/// TensorRT-LLM calculateFreeMemBytes): {(free + memoryPoolFreeBytes) x fraction, hostBytes}.
inline std::pair<uint64_t, uint64_t> calculateFreeMemBytes(int32_t cudaDevice,
                                                           double freeGpuMemoryFraction,
                                                           uint64_t memoryPoolFreeBytes,
                                                           uint64_t hostCacheBytes) {
    std::pair<uint64_t, uint64_t> out{};
    check(kvb_calculate_free_mem_bytes(cudaDevice, freeGpuMemoryFraction, memoryPoolFreeBytes,
                                       hostCacheBytes, &out.first, &out.second));
    return out;
}

/// Manager configuration: the C config (initialised with defaults) plus owned windows.
struct Config {
    kvb_manager_config_t raw{};
    std::vector<kvb_window_config_t> windows;
    /// The disk tier (`withDiskTier`); its directory is attached when the manager is created.
    bool hasDisk = false;
    kvb_disk_tier_config_t disk{};
    std::string diskDirectory;
    /// The shared remote tier (`withRemoteTier`); its strings are attached at creation.
    bool hasRemote = false;
    kvb_remote_tier_config_t remote{};
    std::string remoteUrls, remoteModelId, remotePassword;
    std::string remoteTlsCaFile, remoteTlsCertFile, remoteTlsKeyFile;
    /// The model's layers in order (kvb_manager_config_t::layers); empty: one pool per window.
    std::vector<kvb_layer_spec_t> layers;

    Config() { check(kvb_manager_config_init(&raw)); }

    /// Adds a window of `window_size` tokens with its pool layout.
    Config& addWindow(int32_t window_size, int32_t primary_blocks, int32_t secondary_blocks = 0,
                      int32_t num_layers = 1, int32_t num_kv_heads = 1, int32_t size_per_head = 1) {
        windows.push_back(kvb_window_config_t{window_size, primary_blocks, secondary_blocks,
                                              num_layers, num_kv_heads, size_per_head,
                                              /*auto_host_tier*/ false});
        return *this;
    }
    /// Adds a disk tier below the host tier in `directory` (kept across runs: a new manager with
    /// the same geometry and budget reuses it); `bytesPerWindow` 0 = a share of the free space.
    Config& withDiskTier(std::string directory, uint64_t bytesPerWindow = 0,
                         kvb_disk_write_policy_t policy = KVB_DISK_WRITE_ALL) {
        check(kvb_disk_tier_config_init(&disk));
        diskDirectory = std::move(directory);
        disk.bytes_per_window = bytesPerWindow;
        disk.write_policy = policy;
        hasDisk = true;
        return *this;
    }
    /// Adds the shared remote tier: `urls` are comma-separated `redis://host:port` URLs (one
    /// server, or the seed nodes of a Redis Cluster with `cluster`), `modelId` what makes two
    /// engines' KV interchangeable, `password` empty for none. Other fields: `remote` after
    /// this call.
    Config& withRemoteTier(std::string urls, std::string modelId, std::string password = "",
                           bool cluster = false,
                           kvb_remote_write_policy_t policy = KVB_REMOTE_WRITE_ON_STORE) {
        check(kvb_remote_tier_config_init(&remote));
        remoteUrls = std::move(urls);
        remoteModelId = std::move(modelId);
        remotePassword = std::move(password);
        remote.cluster = cluster;
        remote.write_policy = policy;
        hasRemote = true;
        return *this;
    }
    /// TLS files of the remote tier (`rediss://` URLs; a library built with TLS): the
    /// authorities the server's certificate must chain to (empty: the system's trust store),
    /// and a client certificate with its key for servers that authenticate clients (both or
    /// neither). Call after `withRemoteTier`.
    Config& withRemoteTls(std::string caFile, std::string certFile = "", std::string keyFile = "") {
        remoteTlsCaFile = std::move(caFile);
        remoteTlsCertFile = std::move(certFile);
        remoteTlsKeyFile = std::move(keyFile);
        return *this;
    }
    /// Adds a window whose host tier the library sizes (kvb_window_config_t::auto_host_tier).
    Config& addWindowWithAutoHostTier(int32_t window_size, int32_t primary_blocks,
                                      int32_t num_layers = 1, int32_t num_kv_heads = 1,
                                      int32_t size_per_head = 1) {
        windows.push_back(kvb_window_config_t{window_size, primary_blocks, 0, num_layers,
                                              num_kv_heads, size_per_head,
                                              /*auto_host_tier*/ true});
        return *this;
    }
    /// Adds `count` layers of one shape (in layer order) to the model.
    Config& addLayers(int32_t count, int32_t window_size, kvb_cache_type_t cache_type,
                      int32_t num_kv_heads, int32_t size_per_head,
                      kvb_kv_data_type_t data_type = KVB_KV_DATA_TYPE_DEFAULT) {
        for (int32_t i = 0; i < count; ++i) {
            layers.push_back(
                kvb_layer_spec_t{window_size, cache_type, num_kv_heads, size_per_head, data_type});
        }
        return *this;
    }
};

}  // namespace kvb

#endif  // KVBLOCK_CONFIG_HPP
