"""Core behaviours through the Python binding: reuse, eviction, host tier, batches, offsets, estimates."""

from __future__ import annotations

import numpy as np
import pytest

import kvblock
from conftest import TPB, make_manager, mark_prefill_computed, prompt


def admit_and_release(m, rid, tokens, store=True):
    a = m.add_sequence(rid, tokens)
    m.store_context_blocks(rid, len(tokens))
    m.remove_sequence(rid, store)
    return a


def test_reuse_of_a_repeated_prompt(manager):
    first = admit_and_release(manager, 1, prompt(9))
    assert first.prepopulated_prompt_len == 0
    assert first.stats.missed_blocks == 3
    again = manager.add_sequence(kvblock.Request(2, prompt(9)))
    # Full blocks are reused; the last prompt token is always computed again.
    assert again.prepopulated_prompt_len == 8
    assert again.stats.reused_blocks == 2
    assert manager.get_request_stats(2).prepopulated_prompt_len == 8
    stats = manager.get_kv_cache_stats()
    assert stats.reused_blocks == 2
    assert stats.tokens_per_block == TPB
    manager.check_invariants()


@pytest.mark.parametrize(
    "tokens",
    [
        list(range(1, 10)),
        tuple(range(1, 10)),
        np.arange(1, 10, dtype=np.int64),  # converted in C++
        np.arange(1, 19, dtype=np.int32)[::2] // 2 + 1,  # not contiguous
        prompt(9),
    ],
    ids=["list", "tuple", "int64", "strided", "int32"],
)
def test_token_inputs_are_equivalent(tokens):
    with make_manager() as m:
        admit_and_release(m, 1, prompt(9))
        assert m.add_sequence(2, tokens).prepopulated_prompt_len == 8
        assert m.get_num_tokens(2) == 9


def test_bad_tokens_raise_type_error(manager):
    with pytest.raises(TypeError):
        manager.add_sequence(1, "not tokens")
    with pytest.raises(TypeError):
        manager.add_sequence(1, [1, 2, 2**40])
    with pytest.raises(TypeError):
        manager.add_sequence(1, np.zeros((2, 2), dtype=np.float32))


def test_request_object_copies_its_tokens():
    tokens = prompt(9)
    r = kvblock.Request(5, tokens, lora_task_id=3, cache_salt=7)
    tokens[:] = 0
    assert r.tokens.tolist() == list(range(1, 10))
    assert (r.request_id, r.num_tokens, r.input_length, r.lora_task_id, r.cache_salt) == (5, 9, 9, 3, 7)
    assert "Request(request_id=5, num_tokens=9" in repr(r)


def test_lora_and_salt_separate_the_cache(manager):
    admit_and_release(manager, 1, prompt(9))
    assert manager.add_sequence(2, prompt(9), lora_task_id=1).prepopulated_prompt_len == 0
    assert manager.add_sequence(3, prompt(9), cache_salt=99).prepopulated_prompt_len == 0
    assert manager.add_sequence(4, prompt(9)).prepopulated_prompt_len == 8


def test_a_request_that_opts_out_of_reuse_neither_reuses_nor_is_stored(manager):
    admit_and_release(manager, 1, prompt(9))
    opted_out = kvblock.Request(2, prompt(9), disable_reuse=True)
    assert opted_out.disable_reuse
    assert manager.add_sequence(opted_out).prepopulated_prompt_len == 0
    manager.remove_sequence(2, False)
    manager.add_sequence(4, prompt(13, start=500), disable_reuse=True)
    mark_prefill_computed(manager, 4)
    manager.store_context_blocks(4, 13)
    manager.remove_sequence(4, True)
    assert manager.add_sequence(5, prompt(13, start=500)).prepopulated_prompt_len == 0
    assert manager.add_sequence(6, prompt(9)).prepopulated_prompt_len == 8


def test_multimodal_digest_is_part_of_the_key(manager):
    item = kvblock.MultimodalItem(b"\x01" * 32, 0, 4)
    admit_and_release(manager, 1, prompt(9), store=True)
    assert manager.add_sequence(2, prompt(9), mm_items=[item]).prepopulated_prompt_len == 0
    with pytest.raises(kvblock.InvalidArgumentError, match="32 bytes"):
        kvblock.MultimodalItem(b"short", 0, 4)


def test_multimodal_digest_of_content_bytes(manager):
    # BLAKE3 of b"abc": the same in every process and run.
    assert kvblock.multimodal_digest(b"abc").hex() == (
        "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    )
    image_a, image_b = bytes(range(200)), bytes(range(1, 201))
    tokens = np.array([1, 2, 3, 4] + [9000] * 8 + [5], dtype=np.int32)  # same placeholders
    item = lambda image: kvblock.MultimodalItem(kvblock.multimodal_digest(image), 4, 8)
    manager.add_sequence(1, tokens, mm_items=[item(image_a)])
    manager.store_context_blocks(1, len(tokens))
    manager.remove_sequence(1, True)
    assert manager.add_sequence(2, tokens, mm_items=[item(image_b)]).prepopulated_prompt_len == 4
    assert manager.add_sequence(3, tokens, mm_items=[item(image_a)]).prepopulated_prompt_len == 12


def test_extra_kv_and_draft_tokens_widen_the_offset_table():
    with make_manager(window=30, num_extra_kv_tokens=2, max_draft_tokens=5) as m:
        assert m.get_max_blocks_per_seq(30) == 10  # ceil(37 / 4)
        assert m.get_offset_table_dimensions() == (10, 1)


def test_automatic_host_tier():
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(64, 8, auto_host_tier=True)], tokens_per_block=TPB, max_sequence_length=64
    )
    with kvblock.KVCacheManager(config) as m:
        assert m.get_host_tier_blocks(64) == 8
    mib = 1 << 20
    assert kvblock.KVCacheManager.calculate_auto_host_tier_blocks(100, 64 * mib, 50 * mib, mib) == 32


def test_eviction_drops_the_least_recently_used_cached_blocks():
    with make_manager(primary=4) as m:
        admit_and_release(m, 1, prompt(9))  # 3 blocks cached
        admit_and_release(m, 2, prompt(13, start=100))  # needs 4: evicts the cached ones
        assert m.get_kv_cache_stats().evicted_blocks >= 2
        assert m.add_sequence(3, prompt(9)).prepopulated_prompt_len == 0
        m.check_invariants()


def test_host_tier_offloads_and_onboards():
    with make_manager(primary=4, secondary=8) as m:
        admit_and_release(m, 1, prompt(9))
        admit_and_release(m, 2, prompt(13, start=100))
        assert m.get_kv_cache_stats().offloaded_blocks >= 2
        again = m.add_sequence(3, prompt(9))
        assert again.prepopulated_prompt_len == 8
        assert m.get_kv_cache_stats().onboarded_blocks >= 1
        m.check_invariants()


def test_retention_priority_is_recorded(manager):
    retention = kvblock.KvCacheRetentionConfig(
        [kvblock.TokenRangeRetentionConfig(0, None, priority=80)], decode_retention_priority=10)
    manager.add_sequence(1, prompt(9), retention=retention)
    block = manager.get_cache_block_ids(1, 256)[0]
    assert manager.get_priority_by_block_id(256, block) == 80
    assert repr(retention).startswith("KvCacheRetentionConfig(token_range_retention_configs=[TokenRange")
    with pytest.raises(kvblock.InvalidRetentionError):
        bad = kvblock.KvCacheRetentionConfig([kvblock.TokenRangeRetentionConfig(0, None, priority=101)])
        manager.add_sequence(2, prompt(9), retention=bad)


def test_generation_store_and_rewind(manager):
    manager.add_sequence(1, prompt(8))
    for t in range(5):
        manager.add_token(1, 1000 + t)
    manager.store_new_block(1)
    assert manager.get_num_tokens(1) == 13
    manager.rewind_kv_cache(1, 2)
    manager.remove_token(1)
    assert manager.get_num_tokens(1) == 10
    ids = manager.get_cache_block_ids(1, 256)
    assert manager.get_last_block_id(1) == ids[-1]
    info = manager.get_block_info(256, ids[0])
    assert info.ref_count == 1 and info.cache_level == kvblock.CacheLevel.PRIMARY
    manager.remove_sequence(1)
    manager.check_invariants()


def test_pinned_blocks_survive_release(manager):
    manager.add_sequence(1, prompt(9))
    mark_prefill_computed(manager, 1)
    pinned = manager.store_blocks_for_reuse(1, pin=True)
    assert len(pinned) == 2
    manager.remove_sequence(1)
    assert all(manager.get_block_info(256, b).ref_count == 1 for b in pinned)
    manager.unpin_blocks_by_id(256, pinned)
    assert all(manager.get_block_info(256, b).is_free for b in pinned)
    manager.check_invariants()


def test_batch_admission_delivers_the_estimate():
    with make_manager(primary=8) as m:
        admit_and_release(m, 1, prompt(9))
        batch = [kvblock.Request(10, prompt(9)), kvblock.Request(11, prompt(9)),
                 kvblock.Request(12, prompt(20, start=500))]
        estimate = m.estimate_batch(batch)
        assert [e.fits for e in estimate] == [True, True, False]
        assert estimate[1].reusable_tokens == 8
        with pytest.raises(kvblock.OutOfBlocksError):
            m.add_sequence_batch(batch)
        assert m.get_num_free_blocks() == 8  # all or nothing
        admitted = m.add_sequence_batch(batch, longest_prefix=True)
        assert [a.prepopulated_prompt_len for a in admitted] == [e.reusable_tokens for e in estimate[:2]]
        assert [a.stats.alloc_total_blocks for a in admitted] == [e.allocated_blocks for e in estimate[:2]]
        m.check_invariants()


def test_offsets_into_a_caller_array_and_a_new_one(manager):
    manager.add_sequence(1, prompt(9))
    manager.add_sequence(2, prompt(5, start=50))
    max_blocks, pools = manager.get_offset_table_dimensions()
    table = np.zeros((pools, 3, 2, max_blocks), dtype=np.int32)
    address = table.ctypes.data
    assert manager.copy_block_offsets(table, 1, 1) == 3
    assert table.ctypes.data == address  # written in place
    assert (table[0, 0] == 0).all()  # slot 0 untouched
    ids = manager.get_cache_block_ids(1, 256)
    # Host offsets of block b: memory_index(b) * 2 * num_layers (K), +1 (V).
    k = [manager.get_block_info(256, b).memory_index * 2 for b in ids]
    assert table[0, 1, 0, :3].tolist() == k
    assert table[0, 1, 1, :3].tolist() == [x + 1 for x in k]
    assert (table[0, 1, :, 3:] == np.iinfo(np.int32).max).all()
    batch = manager.get_block_offsets_of_batch([2, 1])
    assert batch.dtype == np.int32 and batch.shape == (pools, 2, 2, max_blocks)
    assert (batch[:, 1] == table[:, 1]).all()
    out = np.zeros_like(batch)
    assert manager.get_block_offsets_of_batch([2, 1], output=out) is out
    assert (out == batch).all()


@pytest.mark.parametrize(
    "bad",
    [np.zeros((1, 2, 2, 64), dtype=np.int64), np.zeros((1, 2, 3, 64), dtype=np.int32),
     np.zeros((2, 64), dtype=np.int32), np.zeros((1, 2, 2, 64), dtype=np.int32)[:, :, :, ::2], [0] * 256],
    ids=["int64", "shape", "ndim", "strided", "list"])
def test_bad_offset_tables_raise_value_error(manager, bad):
    manager.add_sequence(1, prompt(9))
    with pytest.raises(ValueError, match="int32"):
        manager.copy_block_offsets(bad, 0, 1)


def test_offsets_through_dlpack(manager):
    manager.add_sequence(1, prompt(9))
    max_blocks, pools = manager.get_offset_table_dimensions()
    table = np.zeros((pools, 1, 2, max_blocks), dtype=np.int32)

    class Tensor:  # a DLPack producer that is not a numpy array
        def __dlpack__(self, **kwargs):
            return table.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return table.__dlpack_device__()

    assert manager.copy_block_offsets(Tensor(), 0, 1) == 3
    assert table[0, 0, 0, 2] != 0


def test_scheduler_estimates(manager):
    state = kvblock.RequestState(1, prompt_len=9, max_new_tokens=8)
    assert state.phase == kvblock.RequestPhase.CONTEXT_INIT and state.beam_width == 1
    need = manager.get_needed_blocks_one_step(state, None, False, 256)
    remaining = manager.get_remaining_blocks_to_completion(state, None, 256)
    assert need == 3 and remaining == 5  # ceil(9/4); ceil(17/4)
    admit_and_release(manager, 7, prompt(9))
    assert manager.count_reusable_blocks(kvblock.Request(1, prompt(9)), 256) == 2
    manager.add_sequence(2, prompt(9))
    manager.start_scheduling()
    assert manager.scheduling_has_free_blocks(10, 256)
    manager.scheduling_remove_sequence(2)
    assert manager.get_max_capacity_batch_size(8, 8) == 4
    with pytest.raises(TypeError, match="unexpected keyword"):
        kvblock.RequestState(1, prompt_length=9)


def test_sizing_helpers():
    M = kvblock.KVCacheManager
    assert M.calculate_max_block_requirements_per_beam(100, 4096, 32) == 4
    assert M.calculate_max_block_requirements(64, 64, 4096, 2, 32) >= 4
    assert M.calculate_max_attention_window(64, 64, 1000, 1, 32) == 128
    shares = M.calculate_window_size_to_share([1024, 4096], [2, 2])
    assert shares == pytest.approx([0.2, 0.8])
    primary, secondary = M.calculate_max_num_blocks([1024], 1 << 20, 0, 32)
    assert primary == [32] and secondary == [0]
    with pytest.raises(kvblock.InvalidArgumentError):
        M.calculate_window_size_to_share([1024], [2, 2])
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        M.calculate_max_block_requirements_per_beam(100, 0, 32)


def test_config_defaults_come_from_the_library():
    c = kvblock.ManagerConfig()
    assert (c.tokens_per_block, c.max_beam_width, c.enable_block_reuse, c.copy_backend) == (
        32, 1, True, kvblock.CopyBackend.NONE)
    assert c.attention_dp_rank is None
    c = kvblock.ManagerConfig([kvblock.WindowConfig(64, 4)], max_sequence_length=64, attention_dp_rank=2)
    assert c.attention_dp_rank == 2 and c.windows[0].primary_blocks == 4
    with pytest.raises(TypeError, match="unexpected keyword"):
        kvblock.ManagerConfig(tokens_per_blok=4)


def test_host_pool_pointer():
    with make_manager(primary=4, secondary=4, copy_backend=kvblock.CopyBackend.HOST) as m:
        address, row_bytes = m.get_pool_pointer(256, kvblock.CacheLevel.PRIMARY)
        assert address != 0 and row_bytes == 2 * TPB * 2  # K+V x tokens x bytes_per_element
