"""Events as Python objects, drained from other threads while the scheduler thread keeps calling."""

from __future__ import annotations

import threading

import pytest

import kvblock
from conftest import make_manager, prompt


def test_events_have_the_c_fields():
    with make_manager(max_kv_event_entries=1000, attention_dp_rank=3) as m:
        m.add_sequence(1, prompt(9), lora_task_id=5)
        m.store_context_blocks(1, 9)
        assert m.get_latest_events() == []  # nothing before the flush
        m.flush_iteration_events()
        events = m.get_latest_events()
        types = [e.event_type for e in events]
        assert types == [kvblock.EventType.CREATED, kvblock.EventType.STORED]
        created, stored = events
        assert created.num_primary_blocks == 16 and created.window_size == 256
        assert all(e.attention_dp_rank == 3 for e in events)
        assert stored.parent_hash is None
        assert [b.tokens for b in stored.stored_blocks] == [[1, 2, 3, 4], [5, 6, 7, 8]]
        assert stored.stored_blocks[0].lora_task_id == 5
        assert stored.stored_blocks[0].cache_level == kvblock.CacheLevel.PRIMARY
        assert events[0].event_id < events[1].event_id
        assert "KVCacheEvent(event_id=" in repr(stored)
        # Evicting the stored blocks reports their hashes.
        m.remove_sequence(1)
        m.add_sequence(2, prompt(64, start=100))  # every block
        m.flush_iteration_events()
        events, dropped = m.get_latest_events_and_dropped()
        removed = [h for e in events if e.event_type == kvblock.EventType.REMOVED for h in e.removed_hashes]
        assert {b.block_hash for b in stored.stored_blocks} <= set(removed)
        assert dropped == 0


def test_full_buffer_counts_dropped_events():
    with make_manager(max_kv_event_entries=2) as m:
        for rid in range(4):
            m.add_sequence(rid, prompt(9, start=100 * rid + 1))
            m.store_context_blocks(rid, 9)
        m.flush_iteration_events()
        events, dropped = m.get_latest_events_and_dropped()
        assert len(events) == 2 and dropped > 0


def test_a_waiting_drain_does_not_hold_the_gil():
    # The drainer waits (up to 60 s) inside the library; if it held the GIL, this thread could not
    # flush and the drainer would come back empty.
    with make_manager(max_kv_event_entries=100) as m:
        got = []
        started = threading.Event()

        def drain():
            started.set()
            got.extend(m.get_latest_events(timeout_ms=60_000))

        t = threading.Thread(target=drain)
        t.start()
        started.wait()
        m.add_sequence(1, prompt(9))
        m.store_context_blocks(1, 9)
        m.flush_iteration_events()
        t.join()
        assert [e.event_type for e in got][:1] == [kvblock.EventType.CREATED]


def test_close_releases_a_waiting_drain():
    m = make_manager(max_kv_event_entries=100)
    result = []
    started = threading.Event()

    def drain():
        started.set()
        try:
            result.append(m.get_latest_events(timeout_ms=60_000))
        except kvblock.DestroyedError:  # the drain started after close
            result.append("destroyed")

    t = threading.Thread(target=drain)
    t.start()
    started.wait()
    m.close()
    t.join()
    # Waiting when the manager was closed: an empty list; started after: DestroyedError.
    assert result in ([[]], ["destroyed"])
    with pytest.raises(kvblock.DestroyedError):
        m.get_num_free_blocks()


def test_threads_drain_events_while_another_admits():
    iterations = 200
    with make_manager(primary=64, max_kv_event_entries=100_000) as m:
        stop = threading.Event()
        drained: list[list[kvblock.KVCacheEvent]] = [[], []]

        def drain(k):
            while not stop.is_set():
                drained[k].extend(m.get_latest_events(timeout_ms=20))

        threads = [threading.Thread(target=drain, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        stored = 0
        for i in range(iterations):
            rid = i
            m.add_sequence(rid, prompt(12, start=(i % 10) * 1000))
            m.store_context_blocks(rid, 12)
            m.add_token(rid, 7)
            m.remove_sequence(rid)
            m.flush_iteration_events()
        stats = m.get_kv_cache_stats()
        stop.set()
        for t in threads:
            t.join()
        rest = m.get_latest_events()
        events = drained[0] + drained[1] + rest
        ids = [e.event_id for e in events]
        assert len(ids) == len(set(ids))  # each event delivered once
        for part in drained:  # in delivery order within each drainer
            assert [e.event_id for e in part] == sorted(e.event_id for e in part)
        stored = sum(len(e.stored_blocks) for e in events if e.event_type == kvblock.EventType.STORED)
        removed = sum(len(e.removed_hashes) for e in events if e.event_type == kvblock.EventType.REMOVED)
        assert stored > 0
        assert removed == stats.evicted_blocks
        m.check_invariants()
