// kvblock_trtllm/buffer_manager.hpp: TensorRT-LLM's `runtime::BufferManager` as far as the KV
// cache manager's callers name it: host tensors for the offsets tables (`cpu`), fills and copies
// over tensors the host can address (kvblock's host-backend pools, host tensors), the bytes of a
// window's pools (`getBlockManager().getBufferManager(window).memoryPoolUsed()`) and what
// calculateFreeMemBytes reads (the device and the stream-ordered pool's free bytes). It does not
// allocate device memory or call the CUDA runtime: kvblock moves its own blocks with its copy
// backend, and an engine keeps TensorRT-LLM's BufferManager for its other buffers.
// Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_BUFFER_MANAGER_HPP
#define KVBLOCK_TRTLLM_BUFFER_MANAGER_HPP

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "kvblock_trtllm/tensor.hpp"

namespace kvb::trtllm {

/// TensorRT-LLM `runtime::BufferManager` (the parts above). Copies are synchronous memcpy on
/// host-accessible tensors; a tensor the host cannot address throws KVB_STATUS_UNSUPPORTED
/// instead of being read as host memory. The fills and copies are virtual: an engine (or a port
/// on the CUDA backend) derives a buffer manager that fills and copies device memory, overriding
/// them and `clone`, and the KVCacheTransferManager built from it copies with its overrides.
class BufferManager {
  public:
    using ITensorPtr = ITensor::UniquePtr;
    using IBufferPtr = ITensor::UniquePtr;
    /// TensorRT-LLM's default element type of an untyped buffer.
    static constexpr auto kBYTE_TYPE = nvinfer1::DataType::kUINT8;

    /// Device 0, no stream, an empty memory pool.
    BufferManager() = default;
    /// For calculateFreeMemBytes: the device of the engine's stream and the free bytes of its
    /// stream-ordered memory pool (TensorRT-LLM reads both off its BufferManager).
    BufferManager(SizeType32 device, uint64_t memoryPoolFreeBytes)
        : device_(device), memoryPoolFree_(memoryPoolFreeBytes) {}
    /// TensorRT-LLM's constructor: the engine's shared stream object, kept alive; its `get()`
    /// is the raw `cudaStream_t` (null on a host build). `trimPool` is accepted and not used.
    template <typename Stream, typename = decltype(std::declval<Stream&>().get())>
    explicit BufferManager(std::shared_ptr<Stream> stream, bool trimPool = false)
        : rawStream_(stream ? static_cast<void*>(stream->get()) : nullptr),
          stream_(std::move(stream)) {
        (void)trimPool;
    }
    /// Virtual: a port or engine may extend it with what needs CUDA (its stream, device memory).
    virtual ~BufferManager() = default;
    /// Copies share the stream object.
    BufferManager(BufferManager const&) = default;
    BufferManager& operator=(BufferManager const&) = default;

    /// A host tensor of `dims` and `type`, zero-filled and owned by the tensor (TensorRT-LLM
    /// `BufferManager::cpu`): what an engine hands copyBlockOffsets.
    static ITensorPtr cpu(nvinfer1::Dims const& dims, nvinfer1::DataType type = kBYTE_TYPE) {
        return hostTensor(dims, type, MemoryType::kCPU);
    }
    /// A host buffer of `size` elements (TensorRT-LLM's one-dimensional `cpu`).
    static ITensorPtr cpu(std::size_t size, nvinfer1::DataType type = kBYTE_TYPE) {
        return cpu(ITensor::makeShape({static_cast<ITensor::DimType64>(size)}), type);
    }

    /// Zeroes every byte of `buffer` (TensorRT-LLM `setZero`).
    void setZero(IBuffer& buffer) const { setMem(buffer, 0); }
    /// Sets every byte of `buffer` to `value` (TensorRT-LLM `setMem`).
    virtual void setMem(IBuffer& buffer, int32_t value) const {
        requireHost(buffer, "setMem");
        if (buffer.getSizeInBytes() != 0)
            std::memset(buffer.data(), value, buffer.getSizeInBytes());
    }
    /// Copies all of `src` into `dst`, which must be as large (TensorRT-LLM `copy(src, dst)`).
    virtual void copy(IBuffer const& src, IBuffer& dst) const {
        requireHost(src, "copy");
        requireHost(dst, "copy");
        if (src.getSizeInBytes() > dst.getSizeInBytes())
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "copy: the destination is smaller");
        if (src.getSizeInBytes() != 0) std::memmove(dst.data(), src.data(), src.getSizeInBytes());
    }
    /// Copies `dst`'s size in bytes from host memory `src` (TensorRT-LLM `copy(src, dst, type)`).
    virtual void copy(void const* src, IBuffer& dst, MemoryType srcType) const {
        if (srcType == MemoryType::kGPU)
            throw Error(KVB_STATUS_UNSUPPORTED, "copy: device memory is the engine's to copy");
        requireHost(dst, "copy");
        if (dst.getSizeInBytes() != 0) std::memmove(dst.data(), src, dst.getSizeInBytes());
    }
    /// Copies `src` into host memory `dst` (TensorRT-LLM `copy(src, dst, type)`).
    virtual void copy(IBuffer const& src, void* dst, MemoryType dstType) const {
        if (dstType == MemoryType::kGPU)
            throw Error(KVB_STATUS_UNSUPPORTED, "copy: device memory is the engine's to copy");
        requireHost(src, "copy");
        if (src.getSizeInBytes() != 0) std::memmove(dst, src.data(), src.getSizeInBytes());
    }

    /// A copy of this buffer manager as its own type (what KVCacheTransferManager keeps, so that
    /// a derived buffer manager's fills and copies are the ones it uses). A derived class that
    /// overrides the copies overrides this too; one that does not is copied as this base, whose
    /// copies refuse memory the host cannot address.
    [[nodiscard]] virtual std::shared_ptr<BufferManager const> clone() const {
        return std::make_shared<BufferManager>(*this);
    }

    /// The raw `cudaStream_t` of the engine's stream (null without one).
    [[nodiscard]] void* getRawStream() const { return rawStream_; }
    /// The device calculateFreeMemBytes asks the driver about.
    [[nodiscard]] SizeType32 getDevice() const { return device_; }
    /// Bytes in use in the memory pool: for the buffer manager of a window of a KVCacheManager
    /// (BlockManager::getBufferManager), the bytes of that window's primary pools once they are
    /// allocated (0 before allocatePools, and with the bookkeeping-only backend).
    [[nodiscard]] std::size_t memoryPoolUsed() const { return usedBytes_ ? usedBytes_() : 0; }
    /// Bytes reserved by the pool: what is in use (kvblock allocates its pools exactly).
    [[nodiscard]] std::size_t memoryPoolReserved() const { return memoryPoolUsed(); }
    /// Free bytes of the engine's stream-ordered memory pool (what calculateFreeMemBytes adds to
    /// the device's free bytes).
    [[nodiscard]] std::size_t memoryPoolFree() const {
        return static_cast<std::size_t>(memoryPoolFree_);
    }

    /// The facade's own: a buffer manager whose memoryPoolUsed() asks `usedBytes` (how a
    /// KVCacheManager reports its pools' bytes per window).
    static BufferManager reportingPoolBytes(std::function<std::size_t()> usedBytes) {
        BufferManager b;
        b.usedBytes_ = std::move(usedBytes);
        return b;
    }

  protected:
    /// A zero-filled host tensor owned by itself, typed `memoryType` (kCPU; a port's stand-in
    /// for pinned or device memory on a host build passes its own type).
    static ITensorPtr hostTensor(nvinfer1::Dims const& dims, nvinfer1::DataType type,
                                 MemoryType memoryType) {
        auto elements = ITensor::volume(dims);
        if (elements < 0) throw Error(KVB_STATUS_INVALID_ARGUMENT, "negative extent");
        std::size_t bytes = static_cast<std::size_t>(elements) * dataTypeSize(type);
        if (dataTypeSize(type) == 0)
            throw Error(KVB_STATUS_UNSUPPORTED, "sub-byte element types are not served");
        // 64-byte aligned like TensorRT-LLM's allocations, zeroed so that a table reads the same
        // on every run.
        std::shared_ptr<uint8_t[]> memory(
            new (std::align_val_t{64}) uint8_t[bytes ? bytes : 1](),
            [](uint8_t* p) { operator delete[](p, std::align_val_t{64}); });
        void* data = memory.get();
        return std::make_unique<ITensor>(data, dims, type, memoryType, true,
                                         std::shared_ptr<void const>(memory, memory.get()));
    }

  private:
    static void requireHost(IBuffer const& buffer, char const* what) {
        if (!buffer.isHostAccessible())
            throw Error(KVB_STATUS_UNSUPPORTED,
                        std::string(what) +
                            ": the host cannot address this tensor (device memory "
                            "is the engine's to copy)");
    }

    SizeType32 device_ = 0;
    uint64_t memoryPoolFree_ = 0;
    void* rawStream_ = nullptr;
    std::shared_ptr<void> stream_;  // the engine's stream object, kept alive
    std::function<std::size_t()> usedBytes_;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_BUFFER_MANAGER_HPP
