"""Zero-copy pool views (KVCacheManager.pool_view): shape, dtype, writes landing in the bytes
kvblock moves on offload and onboard, and the manager kept alive by its views."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import kvblock

TPB = 4
LAYERS, HEADS, HEAD = 3, 2, 8
PRIMARY = kvblock.CacheLevel.PRIMARY
SECONDARY = kvblock.CacheLevel.SECONDARY


def host_manager(primary=3, secondary=4, bytes_per_element=4, window=64):
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(window, primary_blocks=primary, secondary_blocks=secondary, num_layers=LAYERS,
                              num_kv_heads=HEADS, size_per_head=HEAD)],
        max_sequence_length=window, tokens_per_block=TPB, bytes_per_element=bytes_per_element,
        copy_backend=kvblock.CopyBackend.HOST)
    return kvblock.KVCacheManager(config)


@pytest.mark.parametrize("bpe, dtype, tail", [(4, np.float32, ()), (2, np.float16, ()), (8, np.float64, ()),
                                              (1, np.uint8, ()), (3, np.uint8, (3,))])
def test_shape_dtype_and_address(bpe, dtype, tail):
    m = host_manager(bytes_per_element=bpe)
    for level, blocks in ((PRIMARY, 3), (SECONDARY, 4)):
        view = m.pool_view(64, level)
        assert isinstance(view, np.ndarray) and view.dtype == dtype and view.flags.writeable
        assert view.shape == (blocks, LAYERS, 2, HEADS, TPB, HEAD) + tail
        address, row_bytes = m.get_pool_pointer(64, level)
        assert view.ctypes.data == address and view[0].nbytes == row_bytes and view.flags.c_contiguous
    del view
    m.close()


def test_no_memory_and_unknown_window():
    m = host_manager(secondary=0)
    with pytest.raises(kvblock.UnsupportedError):
        m.pool_view(64, SECONDARY)
    with pytest.raises(kvblock.InvalidArgumentError):
        m.pool_view(65)
    m.close()
    config = kvblock.ManagerConfig([kvblock.WindowConfig(64, primary_blocks=2)], max_sequence_length=64,
                                   tokens_per_block=TPB)  # copy backend NONE: no pool memory
    with kvblock.KVCacheManager(config) as none, pytest.raises(kvblock.UnsupportedError):
        none.pool_view(64)


def rows(m, rid, level):
    """(block id, memory_index) of a sequence's blocks, each checked to be at `level`."""
    out = []
    for b in m.get_cache_block_ids(rid, 64):
        info = m.get_block_info(64, b)
        assert info.cache_level == level
        out.append((b, info.memory_index))
    return out


def test_writes_through_the_view_travel_with_offload_and_onboard():
    m = host_manager(primary=3, secondary=4)
    gpu, host = m.pool_view(64, PRIMARY), m.pool_view(64, SECONDARY)
    a = np.arange(1, 9, dtype=np.int32)  # two full blocks
    m.add_sequence(1, a)
    written = {}
    for b, row in rows(m, 1, PRIMARY):
        pattern = np.random.default_rng(b).standard_normal(gpu.shape[1:]).astype(np.float32)
        gpu[row] = pattern
        written[b] = pattern
    m.store_context_blocks(1, 8)
    m.remove_sequence(1)
    # A 12-token prompt needs all three primary blocks: A's two are evicted, offloaded to the host.
    m.add_sequence(2, np.arange(100, 112, dtype=np.int32))
    assert m.get_kv_cache_stats().offloaded_blocks == 2
    for b, pattern in written.items():
        info = m.get_block_info(64, b)
        assert info.cache_level == SECONDARY
        np.testing.assert_array_equal(host[info.memory_index], pattern)
        host[info.memory_index, 0, 0, 0, 0, 0] += 1  # a write in the host tier travels back too
        pattern[0, 0, 0, 0, 0] += 1
    gpu[...] = -7.0  # scribble over the primary pool: onboarding must bring the bytes back
    m.store_context_blocks(2, 12)
    m.remove_sequence(2)
    m.add_sequence(3, np.concatenate([a, [5]]).astype(np.int32))  # reuses A's 8 tokens: onboards both
    assert m.get_kv_cache_stats().onboarded_blocks == 2
    for b, row in rows(m, 3, PRIMARY)[:2]:
        np.testing.assert_array_equal(gpu[row], written[b])
    m.remove_sequence(3)
    del gpu, host
    m.close()


def test_the_view_keeps_the_manager_alive():
    # A pool of 1 MiB: freed, glibc would unmap it, and a read through a dangling view would fault.
    m = host_manager(primary=256, secondary=0)
    ref = weakref.ref(m)
    view = m.pool_view(64)
    flat = view.reshape(-1)  # a view of the view keeps it too
    assert m.live_pool_views == 1
    with pytest.raises(kvblock.InvalidArgumentError, match="pool view"):
        m.close()  # refused while a view reads the pools
    del m
    gc.collect()
    assert ref() is not None  # held by the view
    view[...] = 3.0
    assert float(flat.sum()) == 3.0 * view.size
    del view
    gc.collect()
    assert ref() is not None  # `flat` still holds it
    del flat
    gc.collect()
    assert ref() is None


def test_with_block_defers_the_destroy_to_the_last_view():
    with host_manager() as m:
        view = m.pool_view(64)
        ref = weakref.ref(m)
    m.add_sequence(1, np.arange(1, 6, dtype=np.int32))  # still alive: the destroy waits for the view
    view[...] = 1.0
    del m
    gc.collect()
    assert ref() is not None
    del view
    gc.collect()
    assert ref() is None
