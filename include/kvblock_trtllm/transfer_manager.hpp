// kvblock_trtllm/transfer_manager.hpp: TensorRT-LLM's `KVCacheBlockPool` and
// `KVCacheTransferManager` shapes: block copies between a primary and a secondary pool tensor
// the caller holds, addressed by each block's KVCacheIndex. kvblock's own manager moves its
// blocks itself (offloadBlock, onboardBlock, admission); this is for code that drives
// TensorRT-LLM's transfer manager over pools it allocated, on tensors the host can address.
// Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_TRANSFER_MANAGER_HPP
#define KVBLOCK_TRTLLM_TRANSFER_MANAGER_HPP

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvblock_trtllm/block.hpp"
#include "kvblock_trtllm/buffer_manager.hpp"
#include "kvblock_trtllm/tensor.hpp"

namespace kvb::trtllm {

/// TensorRT-LLM `KVCacheBlockPool`: one pool's geometry and its two tensors, each
/// `[blocks][layers][kvFactor][blockSize]` (any shape whose first dimension is the blocks).
struct KVCacheBlockPool {
    SizeType32 numLayers = 0;
    SizeType32 kvFactor = 0;
    SizeType32 numKvHeads = 0;
    SizeType32 sizePerHead = 0;
    SizeType32 tokensPerBlock = 0;
    /// Elements of one layer's K (or V) in a block: heads x tokens x head size.
    SizeType32 blockSize = 0;
    ITensor::SharedPtr primaryPtr;
    ITensor::SharedPtr secondaryPtr;
    bool containsBlockScales = false;
    bool containsIndexerKCache = false;

    /// TensorRT-LLM's constructor; `blockSize` is derived from the heads, head size and tokens.
    KVCacheBlockPool(SizeType32 numLayers, SizeType32 kvFactor, SizeType32 numKvHeads,
                     SizeType32 sizePerHead, SizeType32 tokensPerBlock,
                     ITensor::SharedPtr primaryPtr = nullptr,
                     ITensor::SharedPtr secondaryPtr = nullptr, bool containsBlockScales = false,
                     bool containsIndexerKCache = false)
        : numLayers(numLayers),
          kvFactor(kvFactor),
          numKvHeads(numKvHeads),
          sizePerHead(sizePerHead),
          tokensPerBlock(tokensPerBlock),
          blockSize(numKvHeads * sizePerHead * tokensPerBlock),
          primaryPtr(std::move(primaryPtr)),
          secondaryPtr(std::move(secondaryPtr)),
          containsBlockScales(containsBlockScales),
          containsIndexerKCache(containsIndexerKCache) {}
};

/// TensorRT-LLM `KVCacheTransferManager`: copies a block's row in every pool from the level its
/// KVCacheIndex names to the level of the other block's. Every copy (a whole row, or each slab's
/// first tokens) goes through the buffer manager it was built with (its `clone`): the facade's
/// own copies synchronously on host-accessible tensors and throws (KVB_STATUS_UNSUPPORTED) for a
/// tensor the host cannot address; an engine's derived buffer manager may copy device memory.
/// Copies are complete when the call returns, so syncTransfers has nothing to wait for
/// (TensorRT-LLM orders them on its own streams). Transfer modes other than DRAM throw: kvblock's
/// file tier is its own (KvblockOptions, the disk tier), not a directory per call.
class KVCacheTransferManager {
  public:
    using BlockPtr = std::shared_ptr<KVCacheBlock>;

    /// TensorRT-LLM's constructor; the buffer manager is copied as its own type (`clone`: a
    /// derived buffer manager keeps its copies; its stream is kept alive).
    explicit KVCacheTransferManager(BufferManager const& bufferManager)
        : bufferManager_(bufferManager.clone()) {}

    /// Copies `block`'s rows into `offloadBlock`'s (TensorRT-LLM `offload`); with
    /// `numTokensToCopy` in (0, tokensPerBlock), only the first tokens of every (layer, K|V,
    /// head) slab, as a partial reuse copies. The caller swaps the blocks' addresses after.
    void offload(BlockPtr const& block, BlockPtr const& offloadBlock,
                 std::vector<KVCacheBlockPool> const& pools, int numTokensToCopy = 0,
                 KvCacheTransferMode mode = KvCacheTransferMode::DRAM,
                 std::string const& directory = "") {
        copyBlock(block, offloadBlock, pools, numTokensToCopy, mode, directory);
    }
    /// Copies `offloadedBlock`'s rows into `block`'s (TensorRT-LLM `onboard`).
    void onboard(BlockPtr const& offloadedBlock, BlockPtr const& block,
                 std::vector<KVCacheBlockPool> const& pools, int numTokensToCopy = 0,
                 KvCacheTransferMode mode = KvCacheTransferMode::DRAM,
                 std::string const& directory = "") {
        copyBlock(offloadedBlock, block, pools, numTokensToCopy, mode, directory);
    }
    /// Waits for the copies issued so far: they are complete when issued (see the class).
    void syncTransfers() {}
    /// Orders the engine's stream after the copies: nothing is pending (see the class).
    void syncWithBufferManager() {}
    /// Blocks copied by offload and onboard since construction (the facade's own counter).
    [[nodiscard]] std::size_t getNumCopiedBlocks() const { return copied_; }

  private:
    void copyBlock(BlockPtr const& src, BlockPtr const& dst,
                   std::vector<KVCacheBlockPool> const& pools, int numTokensToCopy,
                   KvCacheTransferMode mode, std::string const& directory) {
        (void)directory;
        if (mode != KvCacheTransferMode::DRAM)
            throw Error(KVB_STATUS_UNSUPPORTED,
                        "KVCacheTransferManager: only DRAM transfers (kvblock's file tier is "
                        "configured on the manager)");
        if (!src || !dst) throw Error(KVB_STATUS_INVALID_ARGUMENT, "null block");
        for (KVCacheBlockPool const& pool : pools) {
            KVCacheIndex const srcIndex = src->getMemoryPoolBlockOffset();
            KVCacheIndex const dstIndex = dst->getMemoryPoolBlockOffset();
            auto fromRow = ITensor::slice(levelOf(pool, srcIndex),
                                          static_cast<std::size_t>(srcIndex.get()), 1);
            auto toRow = ITensor::slice(levelOf(pool, dstIndex),
                                        static_cast<std::size_t>(dstIndex.get()), 1);
            if (fromRow->getSizeInBytes() != toRow->getSizeInBytes())
                throw Error(KVB_STATUS_INVALID_ARGUMENT, "the pools' rows differ in size");
            if (numTokensToCopy <= 0 || numTokensToCopy >= pool.tokensPerBlock ||
                pool.sizePerHead <= 0) {
                bufferManager_->copy(*fromRow, *toRow);
                continue;
            }
            // Row layout [layer][K|V][head][token][element]: the first tokens of every slab, each
            // a byte view of the rows copied by the buffer manager (the host never reads them).
            std::size_t elem = dataTypeSize(fromRow->getDataType());
            std::size_t slab = static_cast<std::size_t>(pool.tokensPerBlock) *
                               static_cast<std::size_t>(pool.sizePerHead) * elem;
            std::size_t part = static_cast<std::size_t>(numTokensToCopy) *
                               static_cast<std::size_t>(pool.sizePerHead) * elem;
            ITensor::SharedPtr from = std::move(fromRow);
            ITensor::SharedPtr to = std::move(toRow);
            for (std::size_t off = 0; off + slab <= from->getSizeInBytes(); off += slab)
                bufferManager_->copy(*bytesOf(from, off, part), *bytesOf(to, off, part));
        }
        ++copied_;
    }
    /// `bytes` bytes of `row` from `offset`, as a byte tensor of the row's memory type (a view
    /// that keeps the row alive; the address is computed, not read).
    static ITensor::UniquePtr bytesOf(ITensor::SharedPtr const& row, std::size_t offset,
                                      std::size_t bytes) {
        void* base = row->data() ? static_cast<uint8_t*>(row->data()) + offset : nullptr;
        return std::make_unique<ITensor>(
            base, ITensor::makeShape({static_cast<ITensor::DimType64>(bytes)}),
            nvinfer1::DataType::kUINT8, row->getMemoryType(), row->isHostAccessible(), row);
    }
    /// The pool's tensor at the level `index` names (slices keep it alive).
    static ITensor::SharedPtr const& levelOf(KVCacheBlockPool const& pool, KVCacheIndex index) {
        ITensor::SharedPtr const& t = index.isPrimary() ? pool.primaryPtr : pool.secondaryPtr;
        if (!t) throw Error(KVB_STATUS_INVALID_ARGUMENT, "the pool has no tensor at that level");
        return t;
    }

    std::shared_ptr<BufferManager const> bufferManager_;
    std::size_t copied_ = 0;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_TRANSFER_MANAGER_HPP
