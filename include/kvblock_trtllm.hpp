// kvblock_trtllm.hpp: TensorRT-LLM's 2026 KVCacheManager surface over kvblock (header-only).
//
// kvb::trtllm::KVCacheManager has the names, argument orders, argument kinds and return shapes
// of TensorRT-LLM's `batch_manager::kv_cache_manager::KVCacheManager`, so an engine's call
// sites port by changing the namespace. Where kvblock's own API (kvblock.hpp, kvblock.h) means
// something else under the same name, this facade gives TensorRT-LLM's meaning:
//  - addToken(id) reserves one KV slot without a token; getTokenCount counts reserved slots.
//    The token ids arrive later, from the engine's request, whenever the facade is handed it
//    (storeContextBlocks, storeNewBlock, storeBlocksForReuse, removeSequence,
//    commitAndGetBlockHashesForRequest, syncTokens); kvblock keeps token content to store
//    blocks for reuse without calling back into the engine.
//  - removeSequence of an unknown id does nothing; a given request means "store for reuse".
//  - getPriorityByBlockId(blockId, windowSize), unpinBlocksById(ids), getCacheBlockIds ->
//    [beam][block], getBlockOffsetsOfBatch(output, firstBatchSlotIdx, batchSize, beamWidth).
//  - maxSequenceLength includes the extra KV tokens and draft tokens, as the executor passes it.
// The engine's request is abstracted as kvb::trtllm::LlmRequest (what the manager reads from
// TensorRT-LLM's LlmRequest and writes back into it). docs/porting-from-trtllm.md
// lists every difference that remains.
//
// The facade is split by concept under kvblock_trtllm/: vocabulary.hpp (aliases, tokens,
// OptionalRef), executor_types.hpp (element types, retention, events), tensor.hpp (ITensor,
// the pools' and offset tables' tensor shape), kv_cache_index.hpp (KVCacheIndex),
// buffer_manager.hpp (BufferManager: host tensors, host copies, pool bytes), request.hpp (the
// engine's request), types.hpp (the calls' structs), block.hpp (block handles),
// transfer_manager.hpp (KVCacheBlockPool, KVCacheTransferManager),
// block_manager.hpp (the window-level views and the owning BlockManager), sizing.hpp (the
// static sizing helpers), generation_request.hpp (the per-sequence record),
// kv_cache_manager.hpp (the manager: construction, sizes, the class),
// kv_cache_manager_pools.hpp (pool tables and tensors, the indexer K cache),
// kv_cache_manager_sequences.hpp (admission, tokens, stores, release, block ids),
// kv_cache_manager_reuse.hpp (reuse tree, estimates, statistics, iteration) and
// block_manager_inl.hpp (the views' definitions).
#ifndef KVBLOCK_TRTLLM_HPP
#define KVBLOCK_TRTLLM_HPP

#include "kvblock_trtllm/vocabulary.hpp"
#include "kvblock_trtllm/executor_types.hpp"
#include "kvblock_trtllm/tensor.hpp"
#include "kvblock_trtllm/kv_cache_index.hpp"
#include "kvblock_trtllm/buffer_manager.hpp"
#include "kvblock_trtllm/request.hpp"
#include "kvblock_trtllm/connector.hpp"
#include "kvblock_trtllm/types.hpp"
#include "kvblock_trtllm/block.hpp"
#include "kvblock_trtllm/transfer_manager.hpp"
#include "kvblock_trtllm/block_manager.hpp"
#include "kvblock_trtllm/sizing.hpp"
#include "kvblock_trtllm/generation_request.hpp"
#include "kvblock_trtllm/kv_cache_manager.hpp"
#include "kvblock_trtllm/kv_cache_manager_pools.hpp"
#include "kvblock_trtllm/kv_cache_manager_sequences.hpp"
#include "kvblock_trtllm/kv_cache_manager_reuse.hpp"
#include "kvblock_trtllm/block_manager_inl.hpp"

#endif  // KVBLOCK_TRTLLM_HPP
