// kvblock_trtllm/tensor.hpp: TensorRT-LLM's tensor shape (`runtime::ITensor` with its
// `nvinfer1::Dims` shapes, `bufferCast`, `BufferRange`, `TRTDataType`) as the facade hands out
// kvblock's pools and takes the block-offset tables. An ITensor here is a typed, shaped view of
// memory that someone else owns (kvblock's pools) or that the tensor owns (BufferManager::cpu).
// Part of kvblock_trtllm.hpp; include that.
#ifndef KVBLOCK_TRTLLM_TENSOR_HPP
#define KVBLOCK_TRTLLM_TENSOR_HPP

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "kvblock_trtllm/executor_types.hpp"

namespace kvb::trtllm {

namespace nvinfer1 {
/// TensorRT's `Dims` (`Dims64`): up to eight extents. The tests and kernels read `d` as a
/// pointer to the extents (`flat_index(shape.d, ...)`), so it stays a plain array.
struct Dims {
    static constexpr int32_t MAX_DIMS = 8;
    int32_t nbDims = 0;
    int64_t d[MAX_DIMS] = {};
};
}  // namespace nvinfer1

/// TensorRT-LLM `runtime::MemoryType`: where a tensor's bytes live.
enum class MemoryType : int32_t { kGPU = 0, kCPU = 1, kPINNED = 2, kUVM = 3, kPINNEDPOOL = 4 };

/// Bytes of one element of a TensorRT element type; 0 for the sub-byte types (INT4, FP4),
/// which the facade's tensors do not address element by element.
inline std::size_t dataTypeSize(nvinfer1::DataType type) {
    switch (type) {
        case nvinfer1::DataType::kINT64:
            return 8;
        case nvinfer1::DataType::kFLOAT:
        case nvinfer1::DataType::kINT32:
            return 4;
        case nvinfer1::DataType::kHALF:
        case nvinfer1::DataType::kBF16:
            return 2;
        case nvinfer1::DataType::kINT8:
        case nvinfer1::DataType::kUINT8:
        case nvinfer1::DataType::kBOOL:
        case nvinfer1::DataType::kFP8:
        case nvinfer1::DataType::kE8M0:
            return 1;
        default:
            return 0;
    }
}

/// TensorRT-LLM `runtime::ITensor` (and its `IBuffer`, the same class here): a base address,
/// a shape, an element type and where the memory lives. Views made by slice/at keep their
/// parent alive, as TensorRT-LLM's do; a view of a kvblock pool is valid while the manager's
/// pools live (kvblock owns them). `isHostAccessible()` says whether the host may read and write
/// the bytes (kvblock's host backend keeps even its primary pools in host memory), which is what
/// the facade's copies (BufferManager, KVCacheTransferManager) check before a memcpy.
class ITensor {
  public:
    using SharedPtr = std::shared_ptr<ITensor>;
    using SharedConstPtr = std::shared_ptr<ITensor const>;
    using UniquePtr = std::unique_ptr<ITensor>;
    using Shape = nvinfer1::Dims;
    using DimType64 = int64_t;

    /// A tensor over `data`; `owner` keeps the memory (or the parent tensor) alive, null for
    /// memory owned elsewhere. Throws for a shape with a negative extent or a sub-byte type.
    ITensor(void* data, Shape const& shape, nvinfer1::DataType type, MemoryType memoryType,
            bool hostAccessible, std::shared_ptr<void const> owner = nullptr)
        : data_(data),
          shape_(shape),
          type_(type),
          memoryType_(memoryType),
          hostAccessible_(hostAccessible),
          owner_(std::move(owner)) {
        if (dataTypeSize(type) == 0)
            throw Error(KVB_STATUS_UNSUPPORTED, "ITensor: sub-byte element types are not served");
        if (volume(shape) < 0) throw Error(KVB_STATUS_INVALID_ARGUMENT, "ITensor: negative extent");
    }
    virtual ~ITensor() = default;
    ITensor(ITensor const&) = delete;
    ITensor& operator=(ITensor const&) = delete;

    /// The first element (null where the pool has no memory: the bookkeeping-only backend).
    [[nodiscard]] void* data() { return data_; }
    /// The first element, read-only.
    [[nodiscard]] void const* data() const { return data_; }
    /// Element `index` of the flattened tensor (TensorRT-LLM `IBuffer::data(index)`).
    [[nodiscard]] void* data(std::size_t index) {
        return static_cast<uint8_t*>(data_) + index * dataTypeSize(type_);
    }
    /// The extents, outermost first.
    [[nodiscard]] Shape const& getShape() const { return shape_; }
    /// The element type (what bufferCast checks the C++ type against).
    [[nodiscard]] nvinfer1::DataType getDataType() const { return type_; }
    /// Where TensorRT-LLM would have the bytes (kGPU for a primary pool even on the host
    /// backend; isHostAccessible says whether the host may touch them).
    [[nodiscard]] MemoryType getMemoryType() const { return memoryType_; }
    /// Whether the host may read and write the bytes (host memory, or kvblock's host-backend
    /// pools, which stand where GPU memory would be).
    [[nodiscard]] bool isHostAccessible() const { return hostAccessible_; }
    /// Elements (the product of the extents; 1 for a rank-0 shape, as TensorRT counts).
    [[nodiscard]] std::size_t getSize() const { return static_cast<std::size_t>(volume(shape_)); }
    /// Elements the memory holds: the size (views never grow).
    [[nodiscard]] std::size_t getCapacity() const { return getSize(); }
    /// Bytes of the elements.
    [[nodiscard]] std::size_t getSizeInBytes() const { return getSize() * dataTypeSize(type_); }

    /// TensorRT-LLM `ITensor::makeShape({...})`.
    static Shape makeShape(std::initializer_list<DimType64> const& dims) {
        if (dims.size() > static_cast<std::size_t>(Shape::MAX_DIMS))
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "makeShape: more than 8 dimensions");
        Shape s;
        s.nbDims = static_cast<int32_t>(dims.size());
        int32_t i = 0;
        for (DimType64 d : dims) s.d[i++] = d;
        return s;
    }
    /// The product of the extents (TensorRT-LLM `ITensor::volume`); negative if any is.
    static DimType64 volume(Shape const& shape) {
        DimType64 v = 1;
        for (int32_t i = 0; i < shape.nbDims; ++i) {
            if (shape.d[i] < 0) return -1;
            v *= shape.d[i];
        }
        return v;
    }

    /// TensorRT-LLM `ITensor::slice(tensor, offset, size)`: rows `offset..offset+size` of the
    /// first dimension, a view that keeps `tensor` alive. A pool's block row is
    /// `slice(pool, memoryPoolBlockIndex, 1)`. Out of range throws (KVB_STATUS_INVALID_ARGUMENT).
    static UniquePtr slice(SharedPtr tensor, std::size_t offset, std::size_t size) {
        if (!tensor) throw Error(KVB_STATUS_INVALID_ARGUMENT, "slice of a null tensor");
        Shape const& s = tensor->shape_;
        if (s.nbDims < 1) throw Error(KVB_STATUS_INVALID_ARGUMENT, "slice of a rank-0 tensor");
        auto rows = static_cast<std::size_t>(s.d[0]);
        if (offset > rows || size > rows - offset)
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "slice [" + std::to_string(offset) + ", +" +
                                                         std::to_string(size) + ") out of " +
                                                         std::to_string(rows) + " rows");
        std::size_t rowBytes = rows == 0 ? 0 : tensor->getSizeInBytes() / rows;
        Shape out = s;
        out.d[0] = static_cast<DimType64>(size);
        void* base =
            tensor->data_ ? static_cast<uint8_t*>(tensor->data_) + offset * rowBytes : nullptr;
        auto* raw = tensor.get();
        return UniquePtr(new ITensor(base, out, raw->type_, raw->memoryType_, raw->hostAccessible_,
                                     std::move(tensor)));
    }
    /// The rows from `offset` to the end of the first dimension.
    static UniquePtr slice(SharedPtr tensor, std::size_t offset) {
        if (!tensor) throw Error(KVB_STATUS_INVALID_ARGUMENT, "slice of a null tensor");
        if (tensor->shape_.nbDims < 1)
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "slice of a rank-0 tensor");
        auto rows = static_cast<std::size_t>(tensor->shape_.d[0]);
        if (offset > rows) throw Error(KVB_STATUS_INVALID_ARGUMENT, "slice offset out of range");
        return slice(std::move(tensor), offset, rows - offset);
    }
    /// TensorRT-LLM `ITensor::at(tensor, {i, j, ...})`: the sub-tensor at the leading indices,
    /// whose shape is the remaining dimensions (a view that keeps `tensor` alive).
    static UniquePtr at(SharedPtr tensor, Shape const& offsetDims) {
        if (!tensor) throw Error(KVB_STATUS_INVALID_ARGUMENT, "at of a null tensor");
        Shape const& s = tensor->shape_;
        if (offsetDims.nbDims > s.nbDims)
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "at: more indices than dimensions");
        std::size_t flat = 0;
        for (int32_t i = 0; i < offsetDims.nbDims; ++i) {
            if (offsetDims.d[i] < 0 || offsetDims.d[i] >= s.d[i])
                throw Error(KVB_STATUS_INVALID_ARGUMENT, "at: index out of range");
            flat =
                flat * static_cast<std::size_t>(s.d[i]) + static_cast<std::size_t>(offsetDims.d[i]);
        }
        Shape out;
        out.nbDims = s.nbDims - offsetDims.nbDims;
        std::size_t inner = 1;
        for (int32_t i = 0; i < out.nbDims; ++i) {
            out.d[i] = s.d[i + offsetDims.nbDims];
            inner *= static_cast<std::size_t>(out.d[i]);
        }
        std::size_t byteOffset = flat * inner * dataTypeSize(tensor->type_);
        void* base = tensor->data_ ? static_cast<uint8_t*>(tensor->data_) + byteOffset : nullptr;
        auto* raw = tensor.get();
        return UniquePtr(new ITensor(base, out, raw->type_, raw->memoryType_, raw->hostAccessible_,
                                     std::move(tensor)));
    }
    /// The same with the indices as a braced list (`ITensor::at(t, {pool})`).
    static UniquePtr at(SharedPtr tensor, std::initializer_list<DimType64> const& offsetDims) {
        return at(std::move(tensor), makeShape(offsetDims));
    }
    /// The same bytes under another shape of the same volume (TensorRT-LLM `ITensor::view`).
    static UniquePtr view(SharedPtr tensor, Shape const& shape) {
        if (!tensor) throw Error(KVB_STATUS_INVALID_ARGUMENT, "view of a null tensor");
        if (volume(shape) != volume(tensor->shape_))
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "view: the volume differs");
        auto* raw = tensor.get();
        return UniquePtr(new ITensor(raw->data_, shape, raw->type_, raw->memoryType_,
                                     raw->hostAccessible_, std::move(tensor)));
    }
    /// Reshapes in place to a shape of the same volume (TensorRT-LLM `reshape`, no growth).
    void reshape(Shape const& shape) {
        if (volume(shape) != volume(shape_))
            throw Error(KVB_STATUS_INVALID_ARGUMENT, "reshape: the volume differs");
        shape_ = shape;
    }

  private:
    void* data_;
    Shape shape_;
    nvinfer1::DataType type_;
    MemoryType memoryType_;
    bool hostAccessible_;
    std::shared_ptr<void const> owner_;
};

/// TensorRT-LLM's `IBuffer`: the facade's tensors are its buffers.
using IBuffer = ITensor;

/// TensorRT-LLM `TRTDataType<T>::value`: the element type of a C++ type.
template <typename T>
struct TRTDataType;
template <>
struct TRTDataType<float> {
    static constexpr auto value = nvinfer1::DataType::kFLOAT;
};
template <>
struct TRTDataType<int32_t> {
    static constexpr auto value = nvinfer1::DataType::kINT32;
};
template <>
struct TRTDataType<int64_t> {
    static constexpr auto value = nvinfer1::DataType::kINT64;
};
template <>
struct TRTDataType<int8_t> {
    static constexpr auto value = nvinfer1::DataType::kINT8;
};
template <>
struct TRTDataType<uint8_t> {
    static constexpr auto value = nvinfer1::DataType::kUINT8;
};
template <>
struct TRTDataType<bool> {
    static constexpr auto value = nvinfer1::DataType::kBOOL;
};
/// Addresses are 64-bit integers to TensorRT (the pool pointer tables).
template <>
struct TRTDataType<void*> {
    static constexpr auto value = nvinfer1::DataType::kINT64;
};

/// TensorRT-LLM `bufferCast<T>(tensor)`: the typed first element of a host-accessible tensor.
/// A tensor of another element size, or one the host cannot address, throws (as TensorRT-LLM
/// checks the type) rather than handing out a pointer that reads garbage.
template <typename T>
T* bufferCast(ITensor& tensor) {
    if (dataTypeSize(tensor.getDataType()) != sizeof(T))
        throw Error(KVB_STATUS_INVALID_ARGUMENT, "bufferCast: element size differs");
    if (!tensor.isHostAccessible())
        throw Error(KVB_STATUS_UNSUPPORTED, "bufferCast: the host cannot address this tensor");
    return static_cast<T*>(tensor.data());
}
/// The read-only form.
template <typename T>
T const* bufferCast(ITensor const& tensor) {
    return bufferCast<T>(const_cast<ITensor&>(tensor));
}

/// TensorRT-LLM `BufferRange<T>`: a tensor's elements as a range (begin/end/size/[]).
template <typename T>
class BufferRange {
  public:
    /// The elements of `tensor` (checked as bufferCast checks).
    explicit BufferRange(ITensor& tensor) : data_(bufferCast<T>(tensor)), size_(tensor.getSize()) {}
    /// The first element.
    T* begin() const { return data_; }
    /// One past the last element.
    T* end() const { return data_ + size_; }
    /// The number of elements.
    [[nodiscard]] std::size_t size() const { return size_; }
    /// Element `i` (unchecked, as a pointer is).
    T& operator[](std::size_t i) const { return data_[i]; }

  private:
    T* data_;
    std::size_t size_;
};

}  // namespace kvb::trtllm

#endif  // KVBLOCK_TRTLLM_TENSOR_HPP
