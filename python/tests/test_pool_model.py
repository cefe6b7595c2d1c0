"""The pool model from Python: layers grouped into pools (MLA's K-only latent, GQA, NVFP4 with its
block scales, a hybrid's recurrent state), the layer map, sizing, and model pool views whose bytes
move with their blocks."""

from __future__ import annotations

import numpy as np
import pytest

import kvblock

TPB = 4
CT, DT = kvblock.CacheType, kvblock.KvDataType
PRIMARY = kvblock.CacheLevel.PRIMARY


def model_manager(layers, primary=3, secondary=4, **fields):
    config = kvblock.ManagerConfig([kvblock.WindowConfig(64, primary_blocks=primary, secondary_blocks=secondary)],
                                   max_sequence_length=64, tokens_per_block=TPB,
                                   copy_backend=kvblock.CopyBackend.HOST, layers=layers, **fields)
    return kvblock.KVCacheManager(config)


def test_pools_follow_the_layers():
    layers = ([kvblock.LayerSpec(64, CT.SELF_K_ONLY, 1, 576, DT.BF16)] * 2
              + [kvblock.LayerSpec(64, CT.SELF, 2, 64, DT.NVFP4)])
    with model_manager(layers) as m:
        assert m.get_num_pools() == 3 and m.get_num_pools(False) == 2
        latent = m.get_pool_info(0)
        assert (latent.cache_type, latent.kv_factor, latent.bytes_per_head_token) == (CT.SELF_K_ONLY, 1, 1152)
        assert m.get_pool_info(2).scales_of == 1
        assert m.get_layer_to_pool_mapping() == [(0, 0), (0, 1), (1, 0)]
        scales = m.get_block_scale_pool_pointers()
        assert scales[0] == 0 and scales[1] != 0
        view = m.model_pool_view(0)
        assert view.shape == (3, 2, 1, 1, TPB, 1152) and view.dtype == np.uint8
        with pytest.raises(kvblock.InvalidArgumentError):
            m.pool_view(64)  # the window's uniform geometry does not describe these pools
        del view


def test_every_pool_row_moves_with_its_block():
    layers = [kvblock.LayerSpec(64, CT.SELF, 2, 8, DT.FP16), kvblock.LayerSpec(64, CT.RECURRENT_STATE, 4, 16, DT.FP32)]
    with model_manager(layers) as m:
        views = [m.model_pool_view(p) for p in range(m.get_num_pools())]
        hosts = [m.model_pool_view(p, kvblock.CacheLevel.SECONDARY) for p in range(m.get_num_pools())]
        a = np.arange(1, 10, dtype=np.int32)  # two full blocks and one token
        m.add_sequence(1, a)
        written = {}
        for b in m.get_cache_block_ids(1, 64)[:2]:
            row = m.get_block_info(64, b).memory_index
            written[b] = [np.random.default_rng(b * 10 + p).integers(1, 255, v.shape[1:], dtype=np.uint8)
                          for p, v in enumerate(views)]
            for v, pattern in zip(views, written[b]):
                v[row] = pattern
        m.store_context_blocks(1, 9)
        m.remove_sequence(1)
        m.add_sequence(2, np.arange(100, 112, dtype=np.int32))  # every primary block: offload
        assert m.get_kv_cache_stats().offloaded_blocks >= 2
        for b, patterns in written.items():
            row = m.get_block_info(64, b).memory_index
            for host, pattern in zip(hosts, patterns):
                np.testing.assert_array_equal(host[row], pattern)
        m.remove_sequence(2, False)
        for v in views:
            v[...] = 0
        m.add_sequence(3, a)  # onboards both blocks; the state snapshot of 8 tokens is the last
        for b in m.get_cache_block_ids(3, 64)[:2]:
            row = m.get_block_info(64, b).memory_index
            for v, pattern in zip(views, written[b]):
                np.testing.assert_array_equal(v[row], pattern)
        m.remove_sequence(3)
        del views, hosts


def test_window_bytes_per_token():
    mla = [kvblock.LayerSpec(4096, CT.SELF_K_ONLY, 1, 576, DT.BF16)] * 61
    assert kvblock.calculate_window_bytes_per_token(mla, 2, 64) == [(4096, 70272)]
    llama = [kvblock.LayerSpec(8192, CT.SELF, 8, 128)] * 32
    [(window, per_token)] = kvblock.calculate_window_bytes_per_token(llama, 2, 64)
    assert (window, per_token) == (8192, 131072)
    with pytest.raises(kvblock.InvalidConfigError):
        kvblock.calculate_window_bytes_per_token([kvblock.LayerSpec(64, CT.SELF, 1, 24, DT.NVFP4)])
