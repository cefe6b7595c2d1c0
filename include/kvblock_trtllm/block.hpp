// kvblock_trtllm/block.hpp: TensorRT-LLM's block objects (KVCacheBlock, BlockPtr) as live
// handles onto kvblock's blocks, declared here and defined in block_manager_inl.hpp once
// KVCacheManager is complete. Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_BLOCK_HPP
#define KVBLOCK_TRTLLM_BLOCK_HPP

#include <cstddef>
#include <memory>
#include <ostream>
#include <utility>

#include "kvblock_trtllm/kv_cache_index.hpp"
#include "kvblock_trtllm/types.hpp"

namespace kvb::trtllm {

class KVCacheManager;
class BlockPtr;

/// One block of one window (TensorRT-LLM `KVCacheBlock`). kvblock owns its blocks; this is a
/// handle by (window, id) whose every query reads the block's state now, so it follows the
/// block through offloads, onboards, stores and evictions as TensorRT-LLM's shared block object
/// does. Valid while the KVCacheManager (or owning BlockManager) that made it lives.
class KVCacheBlock {
  public:
    using IdType = BlockIdType;
    /// The id TensorRT-LLM gives the root of the reuse tree (`kCachedBlocksRootId`): the block
    /// getPrevBlock() returns for a block at the top of the tree.
    static constexpr IdType kCachedBlocksRootId = -1;

    KVCacheBlock(KVCacheManager const& owner, SizeType32 windowSize, IdType blockId)
        : owner_(&owner), windowSize_(windowSize), blockId_(blockId) {}
    /// TensorRT-LLM's constructor: a standalone block with its own pool address and no
    /// manager, as a caller of KVCacheTransferManager builds one. It answers getBlockId,
    /// isPrimary and getMemoryPoolBlockIndex from `blockIdx` and swaps it with
    /// swapMemoryPoolBlockOffset; the queries that need a manager throw
    /// (KVB_STATUS_UNSUPPORTED).
    KVCacheBlock(IdType blockId, KVCacheIndex blockIdx)
        : owner_(nullptr), windowSize_(0), blockId_(blockId), standaloneIndex_(blockIdx) {}

    /// TensorRT-LLM `getBlockId`.
    [[nodiscard]] IdType getBlockId() const { return blockId_; }
    /// The attention window whose pools hold the block (TensorRT-LLM keeps one block manager a
    /// window; kvblock's block ids are per window too).
    [[nodiscard]] SizeType32 getWindowSize() const { return windowSize_; }
    /// kvblock's snapshot of the block now (kvb_manager_get_block_info). The root of the reuse
    /// tree has none: it throws KVB_STATUS_INVALID_ARGUMENT.
    [[nodiscard]] kvb_block_info_t getInfo() const;
    /// TensorRT-LLM `isPrimary`: whether the block is in GPU memory now (the root: true).
    [[nodiscard]] bool isPrimary() const;
    /// TensorRT-LLM `getMemoryPoolBlockIndex`: the block's row in the pools of the level it is
    /// on now (GPU rows while primary, host rows while offloaded).
    [[nodiscard]] SizeType32 getMemoryPoolBlockIndex() const;
    /// TensorRT-LLM `getPriority`: the retention priority (0..100, 35 by default).
    [[nodiscard]] SizeType32 getPriority() const;
    /// TensorRT-LLM `setPriority`: the block's retention priority (0..100) from now on; a
    /// sequence's block is queued at it when released, a free block is queued again at it.
    void setPriority(SizeType32 priority) const;
    /// TensorRT-LLM `getNumRefs`: one reference per beam of each sequence holding the block,
    /// plus its pins.
    [[nodiscard]] SizeType32 getNumRefs() const;
    /// TensorRT-LLM `hasRefs`.
    [[nodiscard]] bool hasRefs() const { return getNumRefs() > 0; }
    /// TensorRT-LLM `isLeaf`: no child in the reuse tree (true outside the tree).
    [[nodiscard]] bool isLeaf() const;
    /// TensorRT-LLM `getHash`: the block's hash while it is in the reuse tree (0 otherwise).
    [[nodiscard]] std::size_t getHash() const;
    /// TensorRT-LLM `getPrevBlock`: the block's parent in the reuse tree, the root (id
    /// kCachedBlocksRootId) for a block at the top, null for the root and for a block outside
    /// the tree. kvblock keeps the tree's links only: a block that never entered the tree has
    /// no previous block, where TensorRT-LLM also links a sequence's blocks as it allocates.
    [[nodiscard]] BlockPtr getPrevBlock() const;
    /// The block's pool address now as TensorRT-LLM's `KVCacheIndex` (row and level).
    [[nodiscard]] KVCacheIndex getMemoryPoolBlockOffset() const {
        if (!owner_) return standaloneIndex_;
        return KVCacheIndex(getMemoryPoolBlockIndex(), !isPrimary());
    }
    /// Whether the block belongs to no manager (TensorRT-LLM's constructor).
    [[nodiscard]] bool isStandalone() const { return owner_ == nullptr; }
    /// TensorRT-LLM `swapMemoryPoolBlockOffset`: exchanges the pool addresses of two standalone
    /// blocks (what a transfer's caller does after an offload or onboard). A manager's block
    /// throws (KVB_STATUS_UNSUPPORTED): kvblock moves its own blocks and their addresses.
    void swapMemoryPoolBlockOffset(std::shared_ptr<KVCacheBlock> const& otherBlock) {
        if (!otherBlock) throw Error(KVB_STATUS_INVALID_ARGUMENT, "null block");
        if (owner_ || otherBlock->owner_)
            throw Error(KVB_STATUS_UNSUPPORTED,
                        "a manager's block moves with the manager (offloadBlock, onboardBlock)");
        std::swap(standaloneIndex_, otherBlock->standaloneIndex_);
    }

  private:
    /// A standalone block has no manager to ask: the queries that need one throw.
    KVCacheManager const& owner() const {
        if (!owner_)
            throw Error(KVB_STATUS_UNSUPPORTED, "a standalone block has no manager to ask");
        return *owner_;
    }
    KVCacheManager const* owner_;
    SizeType32 windowSize_;
    IdType blockId_;
    KVCacheIndex standaloneIndex_{0};
};

/// TensorRT-LLM's `BlockPtr` (`std::shared_ptr<KVCacheBlock>`): `->`, `*`, `get()`, truth
/// and comparison with nullptr as a shared pointer has them; two handles are equal when they
/// name the same block. It also converts to kvblock's kvb_block_info_t snapshot, what the
/// facade's getBlockById returned before it returned handles.
class BlockPtr {
  public:
    BlockPtr() = default;
    BlockPtr(std::nullptr_t) {}
    explicit BlockPtr(std::shared_ptr<KVCacheBlock> block) : block_(std::move(block)) {}

    KVCacheBlock* operator->() const { return block_.get(); }
    KVCacheBlock& operator*() const { return *block_; }
    [[nodiscard]] KVCacheBlock* get() const { return block_.get(); }
    explicit operator bool() const { return block_ != nullptr; }
    /// The shared pointer itself, for code that stores `std::shared_ptr<KVCacheBlock>`.
    operator std::shared_ptr<KVCacheBlock>() const { return block_; }
    /// The block's state now (kvb_manager_get_block_info); a null handle throws.
    operator kvb_block_info_t() const {
        if (!block_) throw Error(KVB_STATUS_INVALID_ARGUMENT, "null block handle");
        return block_->getInfo();
    }

    friend bool operator==(BlockPtr const& a, std::nullptr_t) { return !a.block_; }
    friend bool operator!=(BlockPtr const& a, std::nullptr_t) {
        return static_cast<bool>(a.block_);
    }
    friend bool operator==(std::nullptr_t, BlockPtr const& a) { return !a.block_; }
    friend bool operator!=(std::nullptr_t, BlockPtr const& a) {
        return static_cast<bool>(a.block_);
    }
    friend bool operator==(BlockPtr const& a, BlockPtr const& b) {
        if (!a.block_ || !b.block_) return !a.block_ && !b.block_;
        return a->getBlockId() == b->getBlockId() && a->getWindowSize() == b->getWindowSize();
    }
    friend bool operator!=(BlockPtr const& a, BlockPtr const& b) { return !(a == b); }
    /// "block <id> (window <w>)" or "null", for test failure messages.
    friend std::ostream& operator<<(std::ostream& os, BlockPtr const& p) {
        if (!p.block_) return os << "null";
        return os << "block " << p->getBlockId() << " (window " << p->getWindowSize() << ")";
    }

  private:
    std::shared_ptr<KVCacheBlock> block_;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_BLOCK_HPP
