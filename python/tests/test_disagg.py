"""Disaggregated prefill/decode from Python: two managers on a LoopbackHub (the bytes checked
through pool views), the receiving-sequence rules, quarantine, and two Python processes over NIXL
(skipped only with KVBLOCK_NIXL_OPTIONAL=1 where NIXL is missing)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvblock

TPB = 4
LAYERS, HEADS, HEAD = 2, 2, 4
WINDOW = 64
PRIMARY = kvblock.CacheLevel.PRIMARY


def host_manager(primary=16):
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(WINDOW, primary_blocks=primary, num_layers=LAYERS, num_kv_heads=HEADS,
                              size_per_head=HEAD)],
        max_sequence_length=WINDOW, tokens_per_block=TPB, bytes_per_element=1,
        copy_backend=kvblock.CopyBackend.HOST, manual_clock=True)
    return kvblock.KVCacheManager(config)


def rows(m, request_id):
    blocks = m.get_cache_block_ids(request_id, WINDOW)
    return m.get_memory_pool_block_indices(blocks, WINDOW)


def kv(seed, n_blocks):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 255, size=(n_blocks, LAYERS, 2, HEADS, TPB, HEAD), dtype=np.uint8)


def pair(hub):
    prefill, decode = host_manager(), host_manager()
    prefill.attach_loopback(hub, "prefill", timeout_ms=500)
    decode.attach_loopback(hub, "decode", timeout_ms=500)
    assert prefill.add_transfer_peer(decode.transfer_metadata()) == "decode"
    assert decode.add_transfer_peer(prefill.transfer_metadata()) == "prefill"
    return prefill, decode


def send(prefill, decode, request_id, tokens, values):
    ticket = decode.receive_ticket(request_id)
    prefill.add_sequence(request_id, tokens)
    prefill.pool_view(WINDOW, PRIMARY)[rows(prefill, request_id)] = values
    lease = prefill.begin_send(request_id, 0, len(tokens))
    prefill.remove_sequence(request_id)
    prefill.post_send(lease, "decode", decode.export_layout(), ticket, b"%d" % request_id)
    return lease


def test_a_prompt_lands_in_the_decode_rows_and_becomes_reusable():
    hub = kvblock.LoopbackHub()
    prefill, decode = pair(hub)
    tokens = np.arange(100, 110, dtype=np.int32)
    admission = decode.add_sequence_receiving(kvblock.Request(1, tokens))
    assert admission.prepopulated_prompt_len == 0
    assert decode.transfer_stats().receiving_blocks == 3
    with pytest.raises(kvblock.SequenceReceivingError):
        decode.add_token(1, 5)
    values = kv(1, 3)
    lease = send(prefill, decode, 1, tokens, values)
    assert prefill.poll_transfers() == [(lease, kvblock.TransferOutcome.DONE)]
    assert decode.take_transfer_notification() == ("prefill", b"1")
    decode.complete_receive(1)
    got = decode.pool_view(WINDOW, PRIMARY)[rows(decode, 1)]
    np.testing.assert_array_equal(got, values)
    assert decode.add_sequence(2, tokens).prepopulated_prompt_len == 8
    s = prefill.transfer_stats()
    assert (s.transfers_done, s.descriptors_unmerged, s.active_leases) == (1, 3, 0)


def test_a_timed_out_transfer_is_quarantined_until_it_completes():
    hub = kvblock.LoopbackHub()
    prefill, decode = pair(hub)
    tokens = np.arange(200, 212, dtype=np.int32)
    decode.add_sequence_receiving(kvblock.Request(3, tokens))
    hub.hold_next()
    lease = send(prefill, decode, 3, tokens, kv(3, 3))
    free = prefill.get_num_free_blocks()
    prefill.advance_time(500)
    assert prefill.poll_transfers() == [(lease, kvblock.TransferOutcome.TIMED_OUT)]
    assert prefill.get_num_free_blocks() == free, "quarantined rows stay out of the free pool"
    assert hub.finish_held() == 1
    assert prefill.poll_transfers() == [(lease, kvblock.TransferOutcome.DONE)]
    assert prefill.get_num_free_blocks() == free + 3
    hold = decode.abort_receive(3, kvblock.TransferOutcome.IN_DOUBT)
    assert hold is not None and decode.transfer_stats().quarantined_blocks == 3
    decode.release_quarantine(hold)
    assert decode.get_num_free_blocks() == 16


def test_garbage_from_the_peer_is_refused():
    hub = kvblock.LoopbackHub()
    prefill, decode = pair(hub)
    tokens = np.arange(8, dtype=np.int32)
    prefill.add_sequence(5, tokens)
    lease = prefill.begin_send(5, 0, 8)
    with pytest.raises(kvblock.InvalidArgumentError, match="layout"):
        prefill.post_send(lease, "decode", b"garbage", b"garbage")
    assert prefill.settle_hold(lease, kvblock.TransferOutcome.NOT_SUBMITTED) is False


PEER = textwrap.dedent(
    """
    import sys, time, numpy as np, kvblock
    from test_disagg import host_manager, rows, kv, WINDOW, PRIMARY
    folder = sys.argv[1]
    def get(name):
        t = time.time()
        while True:
            try:
                return open(f"{folder}/{name}", "rb").read()
            except FileNotFoundError:
                assert time.time() - t < 20, name
                time.sleep(0.005)
    def put(name, data):
        open(f"{folder}/{name}.tmp", "wb").write(data)
        import os; os.rename(f"{folder}/{name}.tmp", f"{folder}/{name}")
    m = host_manager()
    m.attach_nixl("prefill", timeout_ms=5000)
    put("prefill.md", m.transfer_metadata())
    m.add_transfer_peer(get("decode.md"))
    layout, ticket = get("decode.layout"), get("ticket")
    tokens = np.arange(300, 314, dtype=np.int32)
    m.add_sequence(7, tokens)
    m.pool_view(WINDOW, PRIMARY)[rows(m, 7)] = kv(7, 4)
    lease = m.begin_send(7, 0, len(tokens))
    m.remove_sequence(7)
    m.post_send(lease, "decode", layout, ticket, b"7")
    t = time.time()
    while not (events := m.poll_transfers()):
        assert time.time() - t < 20
        time.sleep(0.001)
    put("sent", str(events[0][1]).encode())
    """
)


def test_two_python_processes_over_nixl(tmp_path):
    decode = host_manager()
    try:
        decode.attach_nixl("decode", timeout_ms=5000)
    except kvblock.UnsupportedError as e:
        if os.environ.get("KVBLOCK_NIXL_OPTIONAL") == "1":
            pytest.skip(f"NIXL missing (KVBLOCK_NIXL_OPTIONAL=1): {e}")
        raise AssertionError(f"NIXL is missing: {e}; run scripts/setup.sh --tests and source scripts/nixl_env.sh")
    tokens = np.arange(300, 314, dtype=np.int32)
    decode.add_sequence_receiving(kvblock.Request(7, tokens))
    for name, data in (("decode.md", decode.transfer_metadata()), ("decode.layout", decode.export_layout()),
                       ("ticket", decode.receive_ticket(7))):
        (tmp_path / f"{name}.tmp").write_bytes(data)
        (tmp_path / f"{name}.tmp").rename(tmp_path / name)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(tmp_path)], env=env)
    try:
        import time
        t = time.time()
        while not (tmp_path / "prefill.md").exists():
            assert peer.poll() is None and time.time() - t < 20
            time.sleep(0.005)
        assert decode.add_transfer_peer((tmp_path / "prefill.md").read_bytes()) == "prefill"
        while (note := decode.take_transfer_notification()) is None:
            assert time.time() - t < 20, "no notification"
            time.sleep(0.001)
        assert note == ("prefill", b"7")
        decode.complete_receive(7)
        np.testing.assert_array_equal(decode.pool_view(WINDOW, PRIMARY)[rows(decode, 7)], kv(7, 4))
        assert peer.wait(timeout=20) == 0
        assert (tmp_path / "sent").read_bytes().endswith(b"DONE")
    finally:
        peer.kill()
        peer.wait()
