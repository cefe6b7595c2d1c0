// The facade's TensorRT-LLM tensor shapes (docs/trtllm-parity.md rows 25, 48-50, 60, 86 and the
// tensor section): kvblock's pools as ITensor views, block rows addressed by slice, partial
// copies and offload/onboard observed through those views, offset tables as KVCacheIndex
// tensors, BufferManager's host tensors and pool bytes, and TensorRT-LLM's transfer manager over
// standalone blocks. All on the host backend, whose pools the test can read and write.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "kvblock_trtllm.hpp"
#include "test_support.hpp"

namespace {

using kvb::trtllm::BufferManager;
using kvb::trtllm::BufferRange;
using kvb::trtllm::ITensor;
using kvb::trtllm::KVCacheBlock;
using kvb::trtllm::KVCacheBlockPool;
using kvb::trtllm::KVCacheIndex;
using kvb::trtllm::KVCacheManager;
using kvb::trtllm::KVCacheTransferManager;
using kvb::trtllm::MemoryType;
using kvb::trtllm::Request;
using kvb::trtllm::TRTDataType;
using kvb::trtllm::nvinfer1::DataType;
using kvb_test::EngineStream;
using kvb_test::statusOf;
using kvb_test::tokenRun;

constexpr int32_t kTpb = 4;
constexpr int32_t kWindow = 32;
constexpr int32_t kLayers = 2;
constexpr int32_t kHeads = 2;
constexpr int32_t kHeadSize = 4;
constexpr int32_t kPrimary = 8;
constexpr int32_t kSecondary = 4;
// One layer's K (or V) in a block, in elements, and a block's row in elements.
constexpr int32_t kField = kHeads * kTpb * kHeadSize;
constexpr int32_t kRow = kLayers * 2 * kField;

/// The engine's constructor (kHALF, a shared stream) with pools in host memory.
std::unique_ptr<KVCacheManager> makeManager(int32_t secondary = kSecondary) {
    kvb::trtllm::KvblockOptions options;
    options.copyBackend = KVB_COPY_BACKEND_HOST;
    auto m = std::make_unique<KVCacheManager>(
        kLayers, kHeads, kHeadSize, kTpb,
        KVCacheManager::BlocksPerWindow{{kWindow, {kPrimary, secondary}}}, 8, 1,
        std::vector<KVCacheManager::SizeType32>{kWindow}, DataType::kHALF, 0,
        std::make_shared<EngineStream>(), kWindow, 0, /*enableBlockReuse*/ true,
        kvb::trtllm::CacheType::kSELF, std::nullopt, nullptr, /*enablePartialReuse*/ true,
        /*copyOnPartialReuse*/ true, options);
    m->allocatePools(false);
    return m;
}

/// The row of block `blockId` in `pool`, through TensorRT-LLM's addressing.
uint16_t* rowOf(ITensor::SharedPtr const& pool, int32_t memoryIndex) {
    auto row = ITensor::slice(pool, static_cast<size_t>(memoryIndex), 1);
    return static_cast<uint16_t*>(row->data());
}

/// Admits `tokens` as request `id`, marks its prompt computed and returns the request.
std::shared_ptr<Request> admitComputed(KVCacheManager& m, uint64_t id,
                                       std::vector<int32_t> tokens) {
    auto r = std::make_shared<Request>(id, tokens);
    auto len = static_cast<int32_t>(tokens.size());
    m.addSequenceBatch({{id, len, 1}}, {std::ref(*r)});
    r->contextCurrentPosition = len;
    return r;
}

// The primary and secondary pools are ITensors over kvblock's pool memory, typed by the engine's
// element type and shaped [blocks][layers][K|V][heads x tokens x head size]; slice(pool, i, 1)
// is block row i, the address kvblock gives for that row.
TEST(TrtllmFacadeTensor, PoolTensorsViewKvblocksPoolsTypedByTheEngineType) {
    auto m = makeManager();
    auto const& bm = m->getBlockManager();
    auto primary = bm.getPrimaryPool(0);
    auto secondary = bm.getSecondaryPool(0);
    auto [base, rowBytes] = m->impl().getModelPoolPointer(0, KVB_CACHE_LEVEL_PRIMARY);
    ASSERT_NE(primary->data(), nullptr);
    EXPECT_EQ(primary->data(), base);
    EXPECT_EQ(primary->getDataType(), DataType::kHALF);
    EXPECT_EQ(primary->getMemoryType(), MemoryType::kGPU);
    EXPECT_TRUE(primary->isHostAccessible());
    ASSERT_EQ(primary->getShape().nbDims, 4);
    EXPECT_EQ(primary->getShape().d[0], kPrimary);
    EXPECT_EQ(primary->getShape().d[1], kLayers);
    EXPECT_EQ(primary->getShape().d[2], 2);
    EXPECT_EQ(primary->getShape().d[3], kField);
    EXPECT_EQ(bm.getBlockSize(0), kField);
    EXPECT_EQ(primary->getSizeInBytes(), kPrimary * rowBytes);
    EXPECT_EQ(rowBytes, kRow * sizeof(uint16_t));
    for (int32_t i = 0; i < kPrimary; ++i)
        EXPECT_EQ(static_cast<void*>(rowOf(primary, i)), base + static_cast<size_t>(i) * rowBytes);
    EXPECT_EQ(secondary->data(), m->impl().getModelPoolPointer(0, KVB_CACHE_LEVEL_SECONDARY).first);
    EXPECT_EQ(secondary->getShape().d[0], kSecondary);
    EXPECT_EQ(secondary->getMemoryType(), MemoryType::kPINNED);
    // The layer's pool, the unique pool and the view agree.
    EXPECT_EQ(m->getPrimaryPool(1)->data(), base);
    EXPECT_EQ(m->getUniquePrimaryPool()->data(), base);
    EXPECT_EQ(bm.getPrimaryPoolView(0).data, base);
    // Without a host tier the secondary pool has no rows.
    auto noHost = makeManager(0);
    EXPECT_EQ(noHost->getBlockManager().getSecondaryPool(0)->getShape().d[0], 0);
    EXPECT_EQ(noHost->getBlockManager().getSecondaryPool(0)->getSize(), 0u);
}

// A partial reuse of a block another sequence holds copies the first reused tokens of every
// (layer, K|V, head) slab into a new block; the rest of the new block is untouched. Seen through
// the pool tensor: the layout TensorRT-LLM's kernels assume ([head][token][channel] per slab).
TEST(TrtllmFacadeTensor, APartialCopysBytesAreTheFirstTokensOfEverySlab) {
    auto m = makeManager();
    auto pool = m->getBlockManager().getPrimaryPool(0);
    BufferManager().setZero(*pool);
    auto a = admitComputed(*m, 1, tokenRun(0, 12));
    auto const& idsA = m->getCacheBlockIds(1, kWindow)[0];
    ASSERT_EQ(idsA.size(), 3u);
    for (int32_t id : idsA) {
        uint16_t* row =
            rowOf(pool, m->getBlockManager().getBlockById(id, kWindow)->getMemoryPoolBlockIndex());
        for (int32_t i = 0; i < kRow; ++i) row[i] = static_cast<uint16_t>(1000 * (id + 1) + i);
    }
    m->storeContextBlocks(*a);
    // Tokens 0..5 then another: block 0 whole, 2 tokens of A's block 1, which A holds.
    std::vector<int32_t> prompt = tokenRun(0, 6);
    prompt.push_back(99);
    auto b = std::make_shared<Request>(2, prompt);
    m->addSequenceBatch({{2, 7, 1}}, {std::ref(*b)});
    EXPECT_EQ(b->prepopulatedPromptLen, kTpb + 2);
    auto const& idsB = m->getCacheBlockIds(2, kWindow)[0];
    ASSERT_EQ(idsB.size(), 2u);
    EXPECT_EQ(idsB[0], idsA[0]);
    ASSERT_NE(idsB[1], idsA[1]);
    auto const& blocks = m->getBlockManager();
    uint16_t const* src =
        rowOf(pool, blocks.getBlockById(idsA[1], kWindow)->getMemoryPoolBlockIndex());
    uint16_t const* dst =
        rowOf(pool, blocks.getBlockById(idsB[1], kWindow)->getMemoryPoolBlockIndex());
    int bad = 0;
    for (int32_t i = 0; i < kRow && bad < 5; ++i) {
        int32_t token = (i % (kTpb * kHeadSize)) / kHeadSize;
        uint16_t expected = token < 2 ? src[i] : 0;
        if (dst[i] != expected) ++bad;
        EXPECT_EQ(dst[i], expected) << "element " << i << " (token " << token << ")";
    }
}

// An offload moves a free cached block's bytes to a host row and an onboard brings them back,
// each observed through the pool tensors at the block's row of the level it is on.
TEST(TrtllmFacadeTensor, OffloadAndOnboardMoveBytesBetweenThePoolTensors) {
    auto m = makeManager();
    auto const& bm = m->getBlockManager();
    auto primary = bm.getPrimaryPool(0);
    auto secondary = bm.getSecondaryPool(0);
    auto a = admitComputed(*m, 1, tokenRun(0, 9));
    int32_t first = m->getCacheBlockIds(1, kWindow)[0][0];
    auto block = bm.getBlockById(first, kWindow);
    uint16_t* gpuRow = rowOf(primary, block->getMemoryPoolBlockIndex());
    for (int32_t i = 0; i < kRow; ++i) gpuRow[i] = static_cast<uint16_t>(7 * i + 1);
    (void)m->removeSequence(1, a);  // stored for reuse and free
    ASSERT_TRUE(bm.offloadBlock(block, kWindow));
    ASSERT_FALSE(block->isPrimary());
    EXPECT_FALSE(block->getMemoryPoolBlockOffset().isPrimary());
    uint16_t* hostRow = rowOf(secondary, block->getMemoryPoolBlockIndex());
    for (int32_t i = 0; i < kRow; ++i) ASSERT_EQ(hostRow[i], static_cast<uint16_t>(7 * i + 1)) << i;
    // Written on the host tier, read back on the GPU tier after the onboard.
    for (int32_t i = 0; i < kRow; ++i) hostRow[i] = static_cast<uint16_t>(3 * i + 2);
    ASSERT_TRUE(bm.onboardBlock(first, kWindow));
    ASSERT_TRUE(block->isPrimary());
    uint16_t* back = rowOf(primary, block->getMemoryPoolBlockIndex());
    for (int32_t i = 0; i < kRow; ++i) ASSERT_EQ(back[i], static_cast<uint16_t>(3 * i + 2)) << i;
    // A block a sequence holds moves the same way, as TensorRT-LLM's does: its bytes are read
    // and written through the secondary pool tensor, and the sequence keeps the block.
    auto held = admitComputed(*m, 2, tokenRun(500, 5));
    auto const heldIds = m->getCacheBlockIds(2, kWindow)[0];
    auto heldBlock = bm.getBlockById(heldIds[0], kWindow);
    for (int32_t i = 0; i < kRow; ++i)
        rowOf(primary, heldBlock->getMemoryPoolBlockIndex())[i] = static_cast<uint16_t>(i + 5);
    ASSERT_TRUE(bm.offloadBlock(heldBlock, kWindow));
    ASSERT_FALSE(heldBlock->isPrimary());
    uint16_t* heldHostRow = rowOf(secondary, heldBlock->getMemoryPoolBlockIndex());
    for (int32_t i = 0; i < kRow; ++i) ASSERT_EQ(heldHostRow[i], static_cast<uint16_t>(i + 5));
    for (int32_t i = 0; i < kRow; ++i) heldHostRow[i] = static_cast<uint16_t>(i + 9);
    EXPECT_EQ(m->getCacheBlockIds(2, kWindow)[0], heldIds);
    ASSERT_TRUE(bm.onboardBlock(heldBlock->getBlockId(), kWindow));
    ASSERT_TRUE(heldBlock->isPrimary());
    uint16_t* heldBack = rowOf(primary, heldBlock->getMemoryPoolBlockIndex());
    for (int32_t i = 0; i < kRow; ++i) ASSERT_EQ(heldBack[i], static_cast<uint16_t>(i + 9)) << i;
}

// TensorRT-LLM's file transfer modes (GDS, POSIX_DEBUG_FALLBACK): an offload also writes the
// block's host row to block_<id>_pool_<n>.bin in the directory, and an onboard reads that file
// back first, so bytes written to the file reach the GPU row.
TEST(TrtllmFacadeTensor, FileTransferModesKeepAnOffloadedBlockInAFile) {
    auto m = makeManager();
    auto& bm = m->getBlockManager();
    auto primary = bm.getPrimaryPool(0);
    auto held = admitComputed(*m, 1, tokenRun(0, 9));
    auto block = bm.getBlockById(m->getCacheBlockIds(1, kWindow)[0][1], kWindow);
    uint16_t* gpuRow = rowOf(primary, block->getMemoryPoolBlockIndex());
    for (int32_t i = 0; i < kRow; ++i) gpuRow[i] = static_cast<uint16_t>(i + 11);
    char dirTemplate[] = "/tmp/kvblock-gds-XXXXXX";
    ASSERT_NE(mkdtemp(dirTemplate), nullptr);
    std::string const dir = dirTemplate;
    EXPECT_EQ(statusOf([&] {
                  (void)bm.offloadBlock(block, kWindow, kvb::trtllm::KvCacheTransferMode::GDS, "");
              }),
              KVB_STATUS_INVALID_ARGUMENT)
        << "a file mode needs a directory";
    ASSERT_TRUE(block->isPrimary());
    ASSERT_TRUE(bm.offloadBlock(block, kWindow, kvb::trtllm::KvCacheTransferMode::GDS, dir));
    std::string const file = dir + "/block_" + std::to_string(block->getBlockId()) + "_pool_0.bin";
    std::vector<uint16_t> bytes(kRow);
    {
        std::ifstream in(file, std::ios::binary);
        ASSERT_TRUE(in.read(reinterpret_cast<char*>(bytes.data()), kRow * 2)) << file;
    }
    for (int32_t i = 0; i < kRow; ++i) ASSERT_EQ(bytes[i], static_cast<uint16_t>(i + 11)) << i;
    for (auto& b : bytes) b = static_cast<uint16_t>(b * 3);
    {
        std::ofstream out(file, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<char const*>(bytes.data()), kRow * 2);
    }
    kvb::trtllm::GenerationRequest seq(1, 9, 1, bm.getWindowSizesMetadata());
    ASSERT_TRUE(bm.onboardBlock(seq, block, kWindow, kvb::trtllm::KvCacheTransferMode::GDS, dir));
    ASSERT_TRUE(block->isPrimary());
    uint16_t const* back = rowOf(primary, block->getMemoryPoolBlockIndex());
    for (int32_t i = 0; i < kRow; ++i) ASSERT_EQ(back[i], static_cast<uint16_t>(3 * (i + 11))) << i;
    std::filesystem::remove_all(dir);
}

// Offset tables as TensorRT-LLM's KVCacheIndex tensors: the same entries kvblock writes into its
// own table, only the request's slots written, and the tensor addressed by at() and slice().
TEST(TrtllmFacadeTensor, OffsetTablesAreKVCacheIndexTensors) {
    auto m = makeManager();
    (void)admitComputed(*m, 1, tokenRun(0, 9));
    auto dims = m->getOffsetTableDimensions();
    ASSERT_EQ(dims.numPools, 1);
    constexpr int32_t kSlots = 3;
    ITensor::SharedPtr table =
        BufferManager::cpu(ITensor::makeShape({dims.numPools, kSlots, 2, dims.maxBlocksPerSeq}),
                           TRTDataType<KVCacheIndex>::value);
    EXPECT_EQ(table->getDataType(), DataType::kINT32);
    EXPECT_EQ(table->getMemoryType(), MemoryType::kCPU);
    BufferRange<KVCacheIndex> range(*table);
    std::fill(range.begin(), range.end(), KVCacheIndex{7});
    EXPECT_EQ(m->copyBlockOffsets(*table, 1, 1), 3);
    kvb::trtllm::BlockOffsetsTensor reference{std::vector<int32_t>(table->getSize(), 7), kSlots};
    EXPECT_EQ(m->copyBlockOffsets(reference, 1, 1), 3);
    auto const* entries = kvb::trtllm::bufferCast<int32_t>(*table);
    for (size_t i = 0; i < table->getSize(); ++i) EXPECT_EQ(entries[i], reference.data[i]) << i;
    // Slot 1's K and V rows through at() and slice(); slots 0 and 2 are untouched.
    auto slot = ITensor::slice(ITensor::at(table, {0}), 1, 1);
    ASSERT_EQ(slot->getShape().nbDims, 3);
    EXPECT_EQ(slot->getShape().d[0], 1);
    auto const* k = kvb::trtllm::bufferCast<KVCacheIndex>(*slot);
    auto const& ids = m->getCacheBlockIds(1, kWindow)[0];
    for (int32_t b = 0; b < 3; ++b) {
        int32_t row = m->getBlockManager()
                          .getBlockById(ids[static_cast<size_t>(b)], kWindow)
                          ->getMemoryPoolBlockIndex();
        EXPECT_EQ(k[b].get(), row * 2 * kLayers);
        EXPECT_EQ(k[dims.maxBlocksPerSeq + b].get(), row * 2 * kLayers + 1);
        EXPECT_TRUE(k[b].isPrimary());
    }
    EXPECT_EQ(k[3], KVCacheIndex::nullIndex);  // past the sequence's blocks
    auto slot0 = ITensor::slice(ITensor::at(table, {0}), 0, 1);
    EXPECT_EQ(kvb::trtllm::bufferCast<KVCacheIndex>(*slot0)[0].get(), 7);
    // The batch form writes request firstBatchSlotIdx + i at slot i.
    ITensor::SharedPtr batch = BufferManager::cpu(table->getShape(), DataType::kINT32);
    m->getBlockOffsetsOfBatch(*batch, 1, 1, 1);
    EXPECT_EQ(std::memcmp(batch->data(), ITensor::at(table, {0, 1})->data(),
                          static_cast<size_t>(2 * dims.maxBlocksPerSeq) * sizeof(int32_t)),
              0);
    // A table of another type or row length is refused before anything is written.
    ITensor::SharedPtr halfTable = BufferManager::cpu(table->getShape(), DataType::kHALF);
    EXPECT_EQ(statusOf([&] { (void)m->copyBlockOffsets(*halfTable, 0, 1); }),
              KVB_STATUS_INVALID_ARGUMENT);
    ITensor::SharedPtr shortRows = BufferManager::cpu(
        ITensor::makeShape({1, kSlots, 2, dims.maxBlocksPerSeq - 1}), DataType::kINT32);
    EXPECT_EQ(statusOf([&] { (void)m->copyBlockOffsets(*shortRows, 0, 1); }),
              KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(kvb::trtllm::bufferCast<int32_t>(*shortRows)[0], 0);
}

// ITensor's addressing: slice and at offsets in bytes of the element type, views keep their
// parent alive, and out-of-range views are refused.
TEST(TrtllmFacadeTensor, SliceAndAtAddressRowsAndKeepTheParentAlive) {
    ITensor::SharedPtr t = BufferManager::cpu(ITensor::makeShape({4, 3, 2}), DataType::kFLOAT);
    EXPECT_EQ(t->getSize(), 24u);
    EXPECT_EQ(t->getSizeInBytes(), 96u);
    auto* base = static_cast<uint8_t*>(t->data());
    for (int i = 0; i < 24; ++i) kvb::trtllm::bufferCast<float>(*t)[i] = static_cast<float>(i);
    auto rows = ITensor::slice(t, 1, 2);
    EXPECT_EQ(rows->data(), base + 1 * 3 * 2 * 4);
    EXPECT_EQ(rows->getShape().d[0], 2);
    EXPECT_EQ(rows->getShape().d[1], 3);
    auto cell = ITensor::at(t, {2, 1});
    ASSERT_EQ(cell->getShape().nbDims, 1);
    EXPECT_EQ(cell->getShape().d[0], 2);
    EXPECT_EQ(kvb::trtllm::bufferCast<float>(*cell)[0], 2 * 6 + 1 * 2);
    EXPECT_EQ(ITensor::slice(t, 3)->getShape().d[0], 1);
    EXPECT_EQ(ITensor::view(t, ITensor::makeShape({24}))->getShape().nbDims, 1);
    // The view outlives the caller's pointer to its parent.
    ITensor::SharedPtr tail = ITensor::slice(t, 3, 1);
    t.reset();
    EXPECT_EQ(kvb::trtllm::bufferCast<float>(*tail)[5], 23.0f);
    EXPECT_EQ(statusOf([&] { (void)ITensor::slice(tail, 0, 2); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { (void)ITensor::at(tail, {1}); }), KVB_STATUS_INVALID_ARGUMENT);
    EXPECT_EQ(statusOf([&] { (void)kvb::trtllm::bufferCast<int64_t>(*tail); }),
              KVB_STATUS_INVALID_ARGUMENT);
    // Memory the host cannot address is not handed out as a host pointer.
    ITensor device(nullptr, ITensor::makeShape({2}), DataType::kINT32, MemoryType::kGPU, false);
    EXPECT_EQ(statusOf([&] { (void)kvb::trtllm::bufferCast<int32_t>(device); }),
              KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(statusOf([&] { BufferManager().setZero(device); }), KVB_STATUS_UNSUPPORTED);
}

// KVCacheIndex: the top bit is the level; get() drops it; nullIndex is what kvblock writes past
// a sequence's blocks.
TEST(TrtllmFacadeTensor, KVCacheIndexKeepsTheLevelInTheTopBit) {
    KVCacheIndex primary(5), secondary(5, true);
    EXPECT_TRUE(primary.isPrimary());
    EXPECT_FALSE(secondary.isPrimary());
    EXPECT_EQ(secondary.get(), 5);
    EXPECT_NE(primary, secondary);
    EXPECT_EQ(KVCacheIndex::nullIndex.get(), std::numeric_limits<int32_t>::max());
    EXPECT_TRUE(KVCacheIndex::nullIndex.isPrimary());
}

// TensorRT-LLM's transfer manager over standalone blocks: each copy moves the rows of the levels
// the blocks' indices name; a partial copy moves the first tokens of every slab; swapping the
// blocks' offsets is the caller's, and a manager's block refuses it.
TEST(TrtllmFacadeTensor, TheTransferManagerCopiesRowsOfTheLevelsTheIndicesName) {
    BufferManager buffers(std::make_shared<EngineStream>());
    KVCacheTransferManager transfers(buffers);
    KVCacheBlockPool pool(1, 2, 1, 2, 4);  // a row: 2 fields x 4 tokens x 2 channels
    EXPECT_EQ(pool.blockSize, 8);
    pool.primaryPtr = BufferManager::cpu(ITensor::makeShape({2, 1, 2, 8}), DataType::kFLOAT);
    pool.secondaryPtr = BufferManager::cpu(ITensor::makeShape({2, 1, 2, 8}), DataType::kFLOAT);
    float* gpu = kvb::trtllm::bufferCast<float>(*pool.primaryPtr);
    float* host = kvb::trtllm::bufferCast<float>(*pool.secondaryPtr);
    for (int i = 0; i < 32; ++i) gpu[i] = static_cast<float>(i + 1);
    auto onGpu = std::make_shared<KVCacheBlock>(0, KVCacheIndex(1));
    auto onHost = std::make_shared<KVCacheBlock>(1, KVCacheIndex(0, true));
    transfers.offload(onGpu, onHost, {pool});
    for (int i = 0; i < 16; ++i) EXPECT_EQ(host[i], gpu[16 + i]) << i;
    for (int i = 16; i < 32; ++i) EXPECT_EQ(host[i], 0.0f) << i;
    onGpu->swapMemoryPoolBlockOffset(onHost);
    EXPECT_FALSE(onGpu->isPrimary());
    EXPECT_EQ(onHost->getMemoryPoolBlockIndex(), 1);
    // Partial: the first token (2 channels) of each of the row's two 8-element slabs.
    for (int i = 0; i < 16; ++i) host[i] = -1.0f;
    transfers.onboard(onGpu, onHost, {pool}, /*numTokensToCopy*/ 1);
    for (int i = 0; i < 16; ++i) {
        float expected = (i % 8) < 2 ? -1.0f : static_cast<float>(16 + i + 1);
        EXPECT_EQ(gpu[16 + i], expected) << i;
    }
    transfers.syncTransfers();
    EXPECT_EQ(transfers.getNumCopiedBlocks(), 2u);
    EXPECT_EQ(statusOf([&] {
                  transfers.offload(onGpu, onHost, {pool}, 0,
                                    kvb::trtllm::KvCacheTransferMode::GDS);
              }),
              KVB_STATUS_UNSUPPORTED);
    auto m = makeManager();
    (void)admitComputed(*m, 1, tokenRun(0, 5));
    std::shared_ptr<KVCacheBlock> managed =
        m->getBlockManager().getBlockById(m->getCacheBlockIds(1, kWindow)[0][0], kWindow);
    EXPECT_EQ(statusOf([&] { managed->swapMemoryPoolBlockOffset(onGpu); }), KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(statusOf([&] { (void)onGpu->getNumRefs(); }), KVB_STATUS_UNSUPPORTED);
}

/// An engine's buffer manager that copies memory the host cannot address (device memory on a
/// GPU; here host memory whose tensors say the host cannot touch it), counting its copies.
class DeviceCopyingBufferManager : public BufferManager {
  public:
    explicit DeviceCopyingBufferManager(std::shared_ptr<int> copies) : copies_(std::move(copies)) {}
    using BufferManager::copy;
    void copy(ITensor const& src, ITensor& dst) const override {
        ASSERT_LE(src.getSizeInBytes(), dst.getSizeInBytes());
        ++*copies_;
        std::memmove(dst.data(), src.data(), src.getSizeInBytes());
    }
    std::shared_ptr<BufferManager const> clone() const override {
        return std::make_shared<DeviceCopyingBufferManager>(*this);
    }

  private:
    std::shared_ptr<int> copies_;
};

// The transfer manager copies with the buffer manager it was built from, as its own type: the
// facade's refuses a pool the host cannot address; an engine's that copies device memory moves
// whole rows and each slab's first tokens of such a pool, and the transfer manager never reads
// the bytes itself.
TEST(TrtllmFacadeTensor, TheTransferManagerCopiesWithTheEnginesBufferManager) {
    std::vector<float> deviceBytes(32);
    for (int i = 0; i < 32; ++i) deviceBytes[static_cast<size_t>(i)] = static_cast<float>(i + 1);
    KVCacheBlockPool pool(1, 2, 1, 2, 4);  // a row: 2 fields x 4 tokens x 2 channels
    pool.primaryPtr = std::make_shared<ITensor>(
        deviceBytes.data(), ITensor::makeShape({2, 1, 2, 8}), DataType::kFLOAT, MemoryType::kGPU,
        /*hostAccessible*/ false);
    pool.secondaryPtr = BufferManager::cpu(ITensor::makeShape({2, 1, 2, 8}), DataType::kFLOAT);
    float* host = kvb::trtllm::bufferCast<float>(*pool.secondaryPtr);
    auto onGpu = std::make_shared<KVCacheBlock>(0, KVCacheIndex(1));
    auto onHost = std::make_shared<KVCacheBlock>(1, KVCacheIndex(0, true));

    KVCacheTransferManager hostOnly{BufferManager()};
    EXPECT_EQ(statusOf([&] { hostOnly.offload(onGpu, onHost, {pool}); }), KVB_STATUS_UNSUPPORTED);
    EXPECT_EQ(statusOf([&] { hostOnly.offload(onGpu, onHost, {pool}, 1); }),
              KVB_STATUS_UNSUPPORTED);

    auto copies = std::make_shared<int>(0);
    KVCacheTransferManager transfers{DeviceCopyingBufferManager(copies)};
    transfers.offload(onGpu, onHost, {pool});
    EXPECT_EQ(*copies, 1);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(host[i], static_cast<float>(16 + i + 1)) << i;
    // Partial: the first token (2 channels) of each of the row's two slabs, one copy a slab.
    for (int i = 0; i < 16; ++i) host[i] = -1.0f;
    onGpu->swapMemoryPoolBlockOffset(onHost);
    transfers.onboard(onGpu, onHost, {pool}, /*numTokensToCopy*/ 1);
    EXPECT_EQ(*copies, 3);
    for (int i = 0; i < 16; ++i) {
        float expected = (i % 8) < 2 ? -1.0f : static_cast<float>(16 + i + 1);
        EXPECT_EQ(deviceBytes[static_cast<size_t>(16 + i)], expected) << i;
    }
    EXPECT_EQ(transfers.getNumCopiedBlocks(), 2u);
}

// getBufferManager(window).memoryPoolUsed(): the bytes of the window's primary pools once they
// exist; the sizing helper reads the device and pool free bytes off a BufferManager.
TEST(TrtllmFacadeTensor, AWindowsBufferManagerCountsItsPoolBytes) {
    kvb::trtllm::KvblockOptions options;
    options.copyBackend = KVB_COPY_BACKEND_HOST;
    KVCacheManager m(kLayers, kHeads, kHeadSize, kTpb,
                     KVCacheManager::BlocksPerWindow{{kWindow, {kPrimary, 0}}}, 8, 1,
                     std::vector<KVCacheManager::SizeType32>{kWindow}, DataType::kHALF, 0,
                     std::make_shared<EngineStream>(), kWindow, 0, false,
                     kvb::trtllm::CacheType::kSELF, std::nullopt, nullptr, true, true, options);
    BufferManager const& buffers = m.getBlockManager().getBufferManager(kWindow);
    EXPECT_EQ(buffers.memoryPoolUsed(), 0u);
    m.allocatePools(false);
    EXPECT_EQ(buffers.memoryPoolUsed(), static_cast<size_t>(kPrimary) * kRow * sizeof(uint16_t));
    EXPECT_EQ(&m.getBlockManager().getBufferManager(kWindow), &buffers);
    EXPECT_EQ(statusOf([&] { (void)m.getBlockManager().getBufferManager(kWindow + 1); }),
              KVB_STATUS_INVALID_ARGUMENT);
    BufferManager device(3, 1 << 20);
    EXPECT_EQ(device.getDevice(), 3);
    EXPECT_EQ(device.memoryPoolFree(), 1u << 20);
}

// A manager built without KvblockOptions (TensorRT-LLM's constructor, unchanged) takes the
// process-wide default: here, pools in host memory instead of bookkeeping only.
TEST(TrtllmFacadeTensor, ConstructorsWithoutOptionsTakeTheDefaultOptions) {
    auto build = [] {
        auto m = std::make_unique<KVCacheManager>(
            kLayers, kHeads, kHeadSize, kTpb,
            KVCacheManager::BlocksPerWindow{{kWindow, {kPrimary, 0}}}, 8, 1,
            std::vector<KVCacheManager::SizeType32>{kWindow}, DataType::kHALF, 0,
            std::make_shared<EngineStream>(), kWindow);
        m->allocatePools(false);
        return m;
    };
    kvb::trtllm::KvblockOptions saved = kvb::trtllm::getDefaultKvblockOptions();
    EXPECT_EQ(build()->getUniquePrimaryPool()->data(), nullptr);  // bookkeeping only
    kvb::trtllm::KvblockOptions host;
    host.copyBackend = KVB_COPY_BACKEND_HOST;
    kvb::trtllm::setDefaultKvblockOptions(host);
    auto m = build();
    kvb::trtllm::setDefaultKvblockOptions(saved);
    EXPECT_NE(m->getUniquePrimaryPool()->data(), nullptr);
    EXPECT_EQ(build()->getUniquePrimaryPool()->data(), nullptr);
}

}  // namespace
