"""The scheduler capacity lifecycle through the Python binding: lengths, resize, allocations and
their reverts, suspend / resume through the host tier, stall detection."""

from __future__ import annotations

import pytest

import kvblock
from conftest import make_manager, mark_prefill_computed, prompt


def test_resize_and_a_failed_grow():
    with make_manager(primary=8) as m:
        m.add_sequence(1, prompt(6))
        lengths = m.get_sequence_lengths(1)
        assert (lengths.num_tokens, lengths.capacity, lengths.suspended) == (6, 6, False)
        assert m.resize(1, 16)
        free = m.get_num_free_blocks()
        assert not m.resize(1, 40), "10 blocks do not fit in 8"
        assert m.get_num_free_blocks() == free
        assert m.get_sequence_lengths(1).capacity == 16
        m.check_invariants()


def test_a_shrink_below_the_reused_prompt_raises():
    with make_manager() as m:
        m.add_sequence(1, prompt(9))
        mark_prefill_computed(m, 1)
        m.remove_sequence(1, True)
        assert m.add_sequence(2, prompt(12)).prepopulated_prompt_len == 8
        with pytest.raises(kvblock.InvalidArgumentError, match="reused"):
            m.resize(2, 7)
        assert m.get_sequence_lengths(2).capacity == 12


def test_generation_allocation_and_its_revert():
    with make_manager() as m:
        m.add_sequence(1, prompt(8))
        assert m.allocate_generation(1, num_draft_tokens=3)
        assert m.extend_capacity_for_tokens(1, 2)
        assert m.get_sequence_lengths(1).capacity == 14
        assert m.revert_allocate_generation(1)
        assert m.get_sequence_lengths(1).capacity == 8
        assert not m.revert_allocate_generation(1)


def test_context_revert_outcomes():
    with make_manager(secondary=4) as m:
        m.add_sequence(1, prompt(10))
        assert m.revert_allocate_context(1) == kvblock.ContextRevert.SUSPENDED
        assert m.get_sequence_lengths(1).suspended
        # A second revert has nothing left to undo: it says so (no SequenceSuspendedError).
        assert m.revert_allocate_context(1) == kvblock.ContextRevert.NOTHING
        assert m.get_sequence_lengths(1).suspended
        with pytest.raises(kvblock.SequenceSuspendedError):
            m.add_token(1, 3)
        assert m.resume(1)
        assert m.revert_allocate_context(1) == kvblock.ContextRevert.NOTHING
        m.add_sequence(2, prompt(13, start=100))
        m.advance_history(2, 8)
        assert m.revert_allocate_context(2) == kvblock.ContextRevert.RELEASED
        assert m.add_sequence(3, prompt(13, start=100)).prepopulated_prompt_len == 8


def test_suspended_blocks_go_to_the_host_and_come_back():
    with make_manager(primary=8, secondary=8) as m:
        m.add_sequence(1, prompt(16))
        m.suspend(1)
        assert m.gpu_utilization == 0.0
        m.add_sequence(2, prompt(24, start=1000))
        levels = [m.get_block_info(256, b).cache_level for b in m.get_cache_block_ids(1, 256)]
        assert levels.count(kvblock.CacheLevel.SECONDARY) == 2
        assert not m.resume(1)
        m.remove_sequence(2, False)
        assert m.resume(1)
        levels = [m.get_block_info(256, b).cache_level for b in m.get_cache_block_ids(1, 256)]
        assert levels.count(kvblock.CacheLevel.SECONDARY) == 0
        m.check_invariants()


def test_a_stall_raises_with_its_cause():
    with make_manager(primary=8, stall_pass_threshold=2) as m:
        m.add_sequence(1, prompt(16))
        m.end_scheduling_pass(1, 0)
        with pytest.raises(kvblock.StalledError, match="no host tier"):
            m.end_scheduling_pass(1, 0)
        m.end_scheduling_pass(1, 1)


def test_config_fields_round_trip():
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(64, 8, 0)],
        max_sequence_length=64,
        max_utilization_for_resume=0.5,
        stall_pass_threshold=7,
    )
    assert config.max_utilization_for_resume == 0.5
    assert config.stall_pass_threshold == 7
    with pytest.raises(kvblock.InvalidConfigError):
        kvblock.KVCacheManager(
            kvblock.ManagerConfig([kvblock.WindowConfig(64, 8, 0)], max_sequence_length=64,
                                  max_utilization_for_resume=1.5)
        )
