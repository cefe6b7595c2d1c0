"""The disk tier through the Python binding: blocks evicted from the host tier come back from disk
after a prefetch, the estimate equals the admission, and a restarted manager reuses the files."""

from __future__ import annotations

import time

import pytest

import kvblock
from conftest import TPB, prompt


def disk_manager(directory, primary=8, secondary=4):
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(64, primary, secondary)], tokens_per_block=TPB, max_sequence_length=64
    )
    config.with_disk_tier(str(directory), bytes_per_window=64 * 4096)
    return kvblock.KVCacheManager(config)


def serve(m, rid, tokens):
    m.add_sequence(rid, tokens)
    m.store_context_blocks(rid, len(tokens))
    m.remove_sequence(rid, True)


def settle(m):
    deadline = time.monotonic() + 20
    while True:
        m.disk_poll()
        s = m.get_disk_stats()
        if s.writes_queued == 0 and s.reads_in_flight == 0:
            return s
        assert time.monotonic() < deadline, "disk I/O hangs"
        time.sleep(0.001)


def push_to_disk(m):
    a = prompt(17, start=1000)
    serve(m, 1, a)
    for i in range(6):
        serve(m, 100 + i, prompt(17, start=5000 + 100 * i))
        settle(m)
    return a


def wait_ready(m, request):
    deadline = time.monotonic() + 20
    while m.disk_blocks_in_flight(request) > 0:
        assert time.monotonic() < deadline, "disk reads hang"
        time.sleep(0.001)


def test_a_prefix_comes_back_from_disk(tmp_path):
    with disk_manager(tmp_path) as m:
        assert m.has_disk_tier
        a = push_to_disk(m)
        assert m.get_disk_stats().writes >= 4
        request = kvblock.Request(2, a)
        assert m.estimate_batch([request])[0].reused_blocks == 0
        assert m.disk_prefetch([request])[0].started == 4
        wait_ready(m, request)
        estimate = m.estimate_batch([request])[0]
        admission = m.add_sequence(request)
        assert admission.prepopulated_prompt_len == estimate.reusable_tokens == 16
        assert m.get_disk_stats().hits == 4
        m.check_invariants()


def test_a_restarted_manager_recovers_the_disk_cache(tmp_path):
    with disk_manager(tmp_path) as m:
        a = push_to_disk(m)
        used = settle(m).slots_used
    with disk_manager(tmp_path) as m:
        assert m.get_disk_stats().recovered == used
        request = kvblock.Request(2, a)
        m.disk_prefetch([request])
        wait_ready(m, request)
        assert m.add_sequence(request).prepopulated_prompt_len == 16


def test_the_sizing_helper_gives_the_slots_a_manager_gets(tmp_path):
    budget = 10 * 4096 + 4095
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(64, 8, 4, num_layers=2, num_kv_heads=2, size_per_head=64)],
        tokens_per_block=TPB, max_sequence_length=64, bytes_per_element=2)
    config.with_disk_tier(str(tmp_path), bytes_per_window=budget)
    row = 2 * 2 * 2 * TPB * 64 * 2  # layers x K|V x heads x tokens x head size x bytes
    blocks, slot_bytes = kvblock.KVCacheManager.calculate_disk_tier_blocks(TPB, row, budget)
    with kvblock.KVCacheManager(config) as m:
        s = m.get_disk_stats()
        assert (s.slots, s.slot_bytes) == (blocks, slot_bytes)
    assert slot_bytes % 4096 == 0 and slot_bytes > row
    with pytest.raises(kvblock.InvalidArgumentError):
        kvblock.KVCacheManager.calculate_disk_tier_blocks(0, row, budget)


def test_a_missing_directory_is_a_config_error(tmp_path):
    with pytest.raises(kvblock.InvalidConfigError):
        disk_manager(tmp_path / "missing")


def test_events_say_when_a_block_moves_to_disk(tmp_path):
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(64, 8, 4)], tokens_per_block=TPB, max_sequence_length=64
    )
    config.max_kv_event_entries = 100000
    config.with_disk_tier(str(tmp_path), bytes_per_window=64 * 4096)
    with kvblock.KVCacheManager(config) as m:
        push_to_disk(m)
        m.flush_iteration_events()
        events = m.get_latest_events()
        in_tree, left_tree, on_disk = set(), set(), set()
        for e in events:
            if e.event_type == kvblock.EventType.STORED and not e.disk_tier:
                in_tree.update(b.block_hash for b in e.stored_blocks)
            elif e.event_type == kvblock.EventType.REMOVED and not e.disk_tier:
                left_tree.update(e.removed_hashes)
            elif e.event_type == kvblock.EventType.STORED:
                (b,) = e.stored_blocks
                assert b.cache_level == kvblock.CacheLevel.DISK
                assert b.block_hash in in_tree and b.block_hash in left_tree
                on_disk.add(b.block_hash)
        assert len(on_disk) == m.get_disk_stats().writes >= 4
