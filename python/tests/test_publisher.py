"""The event publisher from Python: a manager's flushed events reach a ZeroMQ subscriber in the
vLLM / Dynamo wire format; bind errors raise TransportError."""

from __future__ import annotations

import struct

import pytest

import kvblock
from conftest import TPB, make_manager, prompt

zmq = pytest.importorskip("zmq")
msgspec = pytest.importorskip("msgspec")


def test_bad_endpoint_raises_transport_error():
    with make_manager(max_kv_event_entries=1024) as m:
        with pytest.raises(kvblock.TransportError):
            kvblock.EventPublisher(m, "nonsense://endpoint")


def test_bad_ports_start_sequences_and_second_publishers_are_refused():
    with make_manager(max_kv_event_entries=1024) as m:
        for endpoint in ("tcp://127.0.0.1:70000", "tcp://127.0.0.1:abc", "inproc://kv"):
            with pytest.raises(kvblock.TransportError):
                kvblock.EventPublisher(m, endpoint)
        with pytest.raises(kvblock.InvalidArgumentError):
            kvblock.EventPublisher(m, "tcp://127.0.0.1:*", start_sequence=2**64 - 1)
        with pytest.raises(kvblock.InvalidArgumentError):
            kvblock.EventPublisher(m, "tcp://127.0.0.1:*", max_queued_bytes=0)
        with kvblock.EventPublisher(m, "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*",
                                    replay_peer_max_bytes=1 << 16, slow_peer_timeout_ms=500):
            with pytest.raises(kvblock.UnsupportedError):
                kvblock.EventPublisher(m, "tcp://127.0.0.1:*")
        # The first one is gone: the manager may get a new publisher.
        kvblock.EventPublisher(m, "tcp://127.0.0.1:*").close()


def test_flushed_events_reach_a_subscriber():
    with make_manager(max_kv_event_entries=1024) as m:
        with kvblock.EventPublisher(m, "tcp://127.0.0.1:*", topic="kv", dp_rank=3) as pub:
            ctx = zmq.Context.instance()
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.setsockopt(zmq.RCVTIMEO, 10000)
            sub.connect(pub.endpoint)
            assert pub.wait_for_subscribers(1, 10000) >= 1
            m.add_sequence(1, prompt(3 * TPB + 1))
            m.store_context_blocks(1, 3 * TPB + 1)
            m.flush_iteration_events()
            topic, seq, payload = sub.recv_multipart()
            sub.close()
            assert topic == b"kv"
            assert struct.unpack(">Q", seq)[0] == 0
            ts, events, rank = msgspec.msgpack.decode(payload)
            assert rank == 3 and isinstance(ts, float)
            stored = [e for e in events if e["type"] == "BlockStored"]
            assert sum(len(e["block_hashes"]) for e in stored) == 3  # full blocks only
            assert all(e["block_size"] == TPB and e["medium"] == "GPU" for e in stored)
            assert pub.stats.batches >= 1
