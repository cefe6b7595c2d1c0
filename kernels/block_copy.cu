// Batched KV block copy: one launch moves a list of block copies between pools.
//
// Compiled at run time by NVRTC (src/cuda/nvrtc.rs) for the device's own architecture.
// A copy moves `num_chunks` runs of `chunk_bytes` bytes, the runs `chunk_stride` bytes apart in
// both the source and the destination row: a whole row is one run; a partial copy (the first n
// tokens of every (layer, K|V, head) slab) is one run per slab. Addresses are device pointers or
// device-mapped pinned host pointers, so the same kernel moves GPU->GPU, host->GPU and GPU->host.
//
// Work is split into units of (copy, slice): `slices_per_copy` CTAs cooperate on one copy, and
// the grid strides over all units. Each thread keeps UNROLL 16-byte loads in flight before it
// stores, which is what hides the latency of reads over PCIe from the mapped host pool.

// Must match `CopyDescriptor` in src/cuda/plan.rs (40 bytes, 8-byte aligned).
struct kvb_copy_descriptor {
    unsigned long long src;
    unsigned long long dst;
    unsigned long long chunk_bytes;
    unsigned long long chunk_stride;
    unsigned int num_chunks;
    // Bit 0: src, dst, chunk_bytes and chunk_stride are multiples of 16 (vector path).
    unsigned int flags;
};

#define KVB_UNROLL 4

template <typename T>
__device__ __forceinline__ void kvb_copy_runs(const kvb_copy_descriptor& d, unsigned int slice,
                                              unsigned int slices_per_copy) {
    const unsigned int per_chunk = (unsigned int)(d.chunk_bytes / sizeof(T));
    const unsigned int total = per_chunk * d.num_chunks;
    const unsigned int step = slices_per_copy * blockDim.x;
    const unsigned char* src = (const unsigned char*)d.src;
    unsigned char* dst = (unsigned char*)d.dst;
    unsigned int i = slice * blockDim.x + threadIdx.x;
    // Byte offset of element i inside its row: chunk index times stride plus offset in chunk.
#define KVB_OFFSET(idx)                                                             \
    (d.num_chunks == 1 ? (unsigned long long)(idx) * sizeof(T)                      \
                       : (unsigned long long)((idx) / per_chunk) * d.chunk_stride + \
                             (unsigned long long)((idx) % per_chunk) * sizeof(T))
    for (; i + (KVB_UNROLL - 1) * step < total; i += KVB_UNROLL * step) {
        T v[KVB_UNROLL];
#pragma unroll
        for (int u = 0; u < KVB_UNROLL; ++u) { v[u] = *(const T*)(src + KVB_OFFSET(i + u * step)); }
#pragma unroll
        for (int u = 0; u < KVB_UNROLL; ++u) { *(T*)(dst + KVB_OFFSET(i + u * step)) = v[u]; }
    }
    for (; i < total; i += step) { *(T*)(dst + KVB_OFFSET(i)) = *(const T*)(src + KVB_OFFSET(i)); }
#undef KVB_OFFSET
}

extern "C" __global__ void kvb_copy_blocks(const kvb_copy_descriptor* descriptors,
                                           unsigned int num_copies, unsigned int slices_per_copy) {
    const unsigned long long units = (unsigned long long)num_copies * slices_per_copy;
    for (unsigned long long unit = blockIdx.x; unit < units; unit += gridDim.x) {
        const kvb_copy_descriptor d = descriptors[unit / slices_per_copy];
        const unsigned int slice = (unsigned int)(unit % slices_per_copy);
        if (d.flags & 1u) {
            kvb_copy_runs<uint4>(d, slice, slices_per_copy);
        } else {
            kvb_copy_runs<unsigned char>(d, slice, slices_per_copy);
        }
    }
}
