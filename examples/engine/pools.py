"""The model's KV cache in kvblock's pools, read and written through the offset tables.

kvblock gives each window (one per attention-window size) a pool laid out as TensorRT-LLM's:
one row per block of [layers of that window, K|V, kv heads, tokens per block, head size]
(`KVCacheManager.pool_view`, a zero-copy numpy array). An offset-table entry `e` of a block is
`memory_index * 2 * layers` for K and `+ 1` for V, so seen as a flat array of
[kv heads, tokens per block, head size] slabs, layer `l` of the window reads slab `e + 2 * l`:
the addressing an attention kernel does. Nothing here looks at block ids or memory indices.
How the slabs' memory is reached (numpy, torch on a GPU, CUDA driver copies) is storage.py's.
"""

from __future__ import annotations

import numpy as np

import kvblock
from storage import HostSlabs


class Pools:
    """The pools of every window and which window and slab each model layer uses."""

    def __init__(self, manager: kvblock.KVCacheManager, cfg, max_len: int, tokens_per_block: int,
                 storage=HostSlabs):
        self.tpb = tokens_per_block
        sizes = sorted({cfg.window_of(i, max_len) for i in range(cfg.num_layers)})
        self.pool_index = {w: i for i, w in enumerate(sizes)}  # offset-table pools: ascending size
        self.slabs = {}
        for w in sizes:
            self.slabs[w] = storage(manager.pool_view(w))  # of [blocks, layers, 2, heads, tpb, head]
        # model layer -> (window size, its index among that window's layers)
        self.layer_at = []
        seen = {w: 0 for w in sizes}
        for i in range(cfg.num_layers):
            w = cfg.window_of(i, max_len)
            self.layer_at.append((w, seen[w]))
            seen[w] += 1
        self.windows = [cfg.windows[i] for i in range(cfg.num_layers)]

    def sequence(self, offsets: np.ndarray) -> "SequenceKV":
        """The KV of one sequence, given its rows of an offset table ([pools][2][blocks])."""
        return SequenceKV(self, offsets)


class ModelPools:
    """The pools of a manager configured with its layers (an MLA model's K-only latent pools):
    which pool and index in it each layer has (`get_layer_to_pool_mapping`), and the pools as
    slabs (`model_pool_view`, float32). Offset-table entry `e` of a block in a pool of
    `kv_factor` rows per layer: layer `l` of the pool reads slab `e + kv_factor * l` (K), and V
    the next one where the pool has V."""

    def __init__(self, manager: kvblock.KVCacheManager, cfg, max_len: int, tokens_per_block: int,
                 storage=HostSlabs):
        self.tpb = tokens_per_block
        self.layer_at = manager.get_layer_to_pool_mapping()
        self.info = [manager.get_pool_info(p) for p in range(manager.get_num_pools(False))]
        self.slabs = [storage(manager.model_pool_view(p)) for p in range(len(self.info))]
        self.pool_index = {i.window_size: p for p, i in enumerate(self.info)}  # the windows
        self.windows = [cfg.windows[i] for i in range(cfg.num_layers)]

    def sequence(self, offsets: np.ndarray) -> "ModelSequenceKV":
        return ModelSequenceKV(self, offsets)


class ModelSequenceKV:
    """`kv` for model.forward over ModelPools: K-only layers store and return their rows only."""

    def __init__(self, pools: ModelPools, offsets: np.ndarray):
        self.p = pools
        self.offsets = offsets

    def attend(self, layer: int, k: np.ndarray, v, positions: np.ndarray):
        p = self.p
        pool, local = p.layer_at[layer]
        slabs, kv_factor = p.slabs[pool], p.info[pool].kv_factor
        table = self.offsets[pool]  # [K|V][blocks]; a K-only pool lists the same entry twice
        blocks, slots = positions // p.tpb, positions % p.tpb
        slabs.write(table[0, blocks] + kv_factor * local, slots, k)
        if v is not None:
            slabs.write(table[0, blocks] + kv_factor * local + 1, slots, v)
        hi = int(positions[-1]) + 1
        window = p.windows[layer]
        lo = 0 if window is None else max(0, int(positions[0]) - window + 1)
        first, last = lo // p.tpb, (hi - 1) // p.tpb + 1
        cut = slice(lo - first * p.tpb, hi - first * p.tpb)
        keys = gather(slabs, table[0, first:last] + kv_factor * local)[cut]
        values = None if v is None else gather(slabs, table[0, first:last] + kv_factor * local + 1)[cut]
        return keys, values, np.arange(lo, hi)


class SequenceKV:
    """`kv` for model.forward: writes a run's K and V at their slots, gathers what it attends to."""

    def __init__(self, pools: Pools, offsets: np.ndarray):
        self.p = pools
        self.offsets = offsets

    def attend(self, layer: int, k: np.ndarray, v: np.ndarray, positions: np.ndarray):
        p = self.p
        w, local = p.layer_at[layer]
        slabs = p.slabs[w]
        table = self.offsets[p.pool_index[w]]  # [K|V][blocks]
        blocks, slots = positions // p.tpb, positions % p.tpb
        slabs.write(table[0, blocks] + 2 * local, slots, k)
        slabs.write(table[1, blocks] + 2 * local, slots, v)
        # Attend to [lo, hi): everything before for full attention, the window for sliding layers
        # (older blocks may be detached and reused by others: never read them).
        hi = int(positions[-1]) + 1
        window = p.windows[layer]
        lo = 0 if window is None else max(0, int(positions[0]) - window + 1)
        first, last = lo // p.tpb, (hi - 1) // p.tpb + 1
        keys = gather(slabs, table[0, first:last] + 2 * local)
        values = gather(slabs, table[1, first:last] + 2 * local)
        cut = slice(lo - first * p.tpb, hi - first * p.tpb)
        return keys[cut], values[cut], np.arange(lo, hi)


def gather(slabs, entries: np.ndarray) -> np.ndarray:
    """The slabs at `entries` as [tokens, heads, head size], in block order."""
    if entries.size and (entries.min() < 0 or entries.max() >= len(slabs)):
        raise IndexError(f"offset-table entry {int(entries.max())} is outside the GPU pool ({len(slabs)} slabs): "
                         "a block in the attention window is not in GPU memory")
    g = slabs.gather(entries)  # [blocks, heads, tpb, head]
    return g.transpose(0, 2, 1, 3).reshape(-1, g.shape[1], g.shape[3])
