#!/usr/bin/env python3
"""KV events on the wire, end to end: the replay publishes over ZeroMQ while this script checks

1. schema: every payload decodes with msgspec structs transcribed from vLLM's published schema
   (`vllm/distributed/kv_events.py`: KVEventBatch / BlockStored / BlockRemoved / AllBlocksCleared,
   map-encoded events, every key required) and the stream obeys the tree rules routers rely on;
2. transport: 3 frames, consecutive sequence numbers, replay from the ROUTER socket with its end
   marker and byte-identical payloads;
3. a real router: NVIDIA Dynamo's standalone KV indexer (`python -m dynamo.indexer`) registered on
   the publisher, once before the replay starts and once late (after batches were missed: it must
   detect the gap and fill it by replay); its `/query` scores for sampled prompts must equal
   kvblock's reusable blocks x block size.

Usage: events_wire_test.py REPLAY_BINARY (run by scripts/test.sh with the project's .venv).
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Optional, Union

import msgspec
import zmq

TPB = 16
WAIT_S = 120
END_SEQ = 0xFFFFFFFFFFFFFFFF


# vLLM's schema, transcribed (vllm/distributed/kv_events.py): the batch is array-like, events are
# tagged maps; a field without a default must be present.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)
results = {"passed": 0, "failed": 0, "skipped": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    return json.loads(text) if text.startswith(("{", "[")) else text


def tree_rules(batches):
    """Applies the stream the way a router does; returns a list of violations."""
    present, bad = set(), []
    for seq, batch in batches:
        if batch.data_parallel_rank is not None:
            bad.append(f"seq {seq}: dp rank {batch.data_parallel_rank}")
        for e in batch.events:
            if isinstance(e, BlockStored):
                if e.block_size != TPB or len(e.token_ids) != len(e.block_hashes) * e.block_size:
                    bad.append(f"seq {seq}: partial block or wrong block_size")
                if e.medium != "GPU" or not e.block_hashes:
                    bad.append(f"seq {seq}: medium {e.medium!r} / {len(e.block_hashes)} hashes")
                if e.parent_block_hash is not None and e.parent_block_hash not in present:
                    bad.append(f"seq {seq}: parent {e.parent_block_hash:x} not stored")
                for h in e.block_hashes:
                    if not 0 <= h < 2**64 or h in present:
                        bad.append(f"seq {seq}: hash {h:x} stored twice or not u64")
                    present.add(h)
            elif isinstance(e, BlockRemoved):
                for h in e.block_hashes:
                    if h not in present:
                        bad.append(f"seq {seq}: removed {h:x} never stored")
                    present.discard(h)
            else:
                bad.append(f"seq {seq}: AllBlocksCleared without being asked")
    return bad, present


def start_indexer():
    """Starts Dynamo's standalone indexer, or returns (None, reason)."""
    try:
        import dynamo.indexer  # noqa: F401
    except Exception as e:  # not installable here: report why
        return None, None, f"dynamo.indexer not importable ({e!r})"
    port = free_port()
    log = open(os.path.join(tempfile.gettempdir(), f"kvb-indexer-{port}.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "dynamo.indexer", "--port", str(port), "--threads", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        try:
            http(port, "/workers")
            return proc, port, None
        except OSError:
            if proc.poll() is not None:
                return None, None, f"indexer exited with {proc.returncode} (log {log.name})"
            time.sleep(0.2)
    proc.kill()
    return None, None, "indexer did not answer"


def main():
    replay_bin = sys.argv[1]
    pub_port, rep_port = free_port(), free_port()
    pub_ep, rep_ep = f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{rep_port}"
    indexer, idx_port, why = start_indexer()
    if indexer is None:
        print(f"skip router check: {why}")
        results["skipped"] += 1

    def register(instance):
        http(idx_port, "/register", {"instance_id": instance, "endpoint": pub_ep, "replay_endpoint": rep_ep,
                                     "model_name": "kvblock", "block_size": TPB})

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, WAIT_S * 1000)
    sub.setsockopt(zmq.RCVHWM, 0)  # the script reads late: keep every batch
    sub.connect(pub_ep)
    if indexer:
        register(1)
    check_path = os.path.join(tempfile.mkdtemp(), "check.jsonl")
    early = 2 if indexer else 1
    # Few primary blocks: the replay evicts (BlockRemoved) and reuses.
    cmd = [replay_bin, "--limit", "200", "--tokens-per-block", str(TPB), "--primary-blocks", "8000",
           "--secondary-blocks", "2000", "--max-output", "16", "--no-svg", "--quiet",
           "--publish", pub_ep, "--publish-replay", rep_ep, "--publish-wait-subscribers", str(early),
           "--publish-late-subscribers", str(early + 1 if indexer else early),
           "--publish-check", check_path, "--publish-hold"]
    replay = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    frames = {}
    late_registered = indexer is None
    next_seq = None
    try:
        # Collect live batches; register the late indexer instance once batches were missed. The
        # replay then finishes, publishes its probe (the late instance unblocks it) and says how
        # many batches it sent.
        while next_seq is None or len(frames) < next_seq:
            msg = sub.recv_multipart()
            seq = int.from_bytes(msg[1], "big")
            frames[seq] = msg
            if not late_registered and seq >= 1:
                register(2)
                late_registered = True
            if next_seq is None and late_registered:
                next_seq = int(read_ready(replay).split("next_sequence=")[1])
        check("frames: 3 per message, empty topic, 8-byte sequence",
              all(len(m) == 3 and m[0] == b"" and len(m[1]) == 8 for m in frames.values()))
        check("sequence: consecutive from 0, no gap", sorted(frames) == list(range(next_seq)),
              f"{next_seq} batches")
        batches, errors = [], []
        for seq in sorted(frames):
            try:
                batches.append((seq, DECODER.decode(frames[seq][2])))
            except msgspec.DecodeError as e:
                errors.append(f"seq {seq}: {e}")
        check("schema: every payload decodes with vLLM's structs", not errors, "; ".join(errors[:3]))
        bad, present = tree_rules(batches)
        n_stored = sum(len(e.block_hashes) for _, b in batches for e in b.events if isinstance(e, BlockStored))
        n_removed = sum(len(e.block_hashes) for _, b in batches for e in b.events if isinstance(e, BlockRemoved))
        check("tree rules: full blocks, removed were stored, parents present", not bad,
              "; ".join(bad[:3]) or f"{n_stored} blocks stored, {n_removed} removed, {len(present)} left")
        check("the stream evicts (BlockRemoved present)", n_removed > 0)

        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, WAIT_S * 1000)
        dealer.connect(rep_ep)
        dealer.send_multipart([b"", (3).to_bytes(8, "big")])
        replayed = []
        while True:
            f = dealer.recv_multipart()
            seq = int.from_bytes(f[2], "big")
            if seq == END_SEQ:
                check("replay: end marker has an empty payload", len(f) == 4 and f[3] == b"")
                break
            replayed.append((seq, f))
        check("replay: [empty, topic, seq, payload] from the start, identical payloads",
              [s for s, _ in replayed] == list(range(3, next_seq))
              and all(f[0] == b"" and f[1] == b"" and f[3] == frames[s][2] for s, f in replayed))

        if indexer:
            router_check(idx_port, check_path)
    finally:
        if replay.stdin:
            replay.stdin.close()
        rest = replay.stdout.read() if replay.stdout else ""
        rc = replay.wait(timeout=WAIT_S)
        if indexer:
            indexer.terminate()
            indexer.wait(timeout=30)
    published = [line for line in rest.splitlines() if "published" in line]
    check("replay exits 0", rc == 0, published[0].strip() if published else "")
    print(f"{results['passed']} passed, {results['failed']} failed, {results['skipped']} skipped")
    return 1 if results["failed"] else 0


def read_ready(replay):
    for line in replay.stdout:
        if line.startswith("publish-hold: ready"):
            return line.strip()
        if "published" in line:
            print(line.rstrip(), flush=True)
    raise RuntimeError("the replay ended before 'publish-hold: ready'")


def router_check(idx_port, check_path):
    prompts = [json.loads(line) for line in open(check_path)]
    want = [p["reusable_blocks"] * TPB for p in prompts]

    def scores():
        out = []
        for p in prompts:
            # kvblock (like TensorRT-LLM and vLLM) never reuses a prompt's last token: its count
            # is the full blocks of all tokens but the last, which is what the router sees for
            # that prefix.
            r = http(idx_port, "/query", {"token_ids": p["tokens"][:-1], "model_name": "kvblock"})
            s = r.get("scores", {})
            out.append({inst: s.get(inst, {}).get("0", 0) for inst in ("1", "2")})
        return out

    # The indexer applies events asynchronously: wait (bounded) for it to settle on kvblock's view.
    deadline = time.time() + WAIT_S
    got = scores()
    while time.time() < deadline and any(g[i] != w for g, w in zip(got, want) for i in ("1", "2")):
        time.sleep(0.5)
        got = scores()
    for inst, label in (("1", "registered before the replay"), ("2", "registered late, gap filled by replay")):
        diff = [(k, g[inst], w) for k, (g, w) in enumerate(zip(got, want)) if g[inst] != w]
        check(f"router: Dynamo indexer instance {inst} ({label}) scores == reusable blocks x {TPB}", not diff,
              f"{len(prompts)} prompts, {sum(w > 0 for w in want)} with reuse, {sum(want)} matched tokens"
              + (f"; mismatches (prompt, indexer, kvblock): {diff[:5]}" if diff else ""))


if __name__ == "__main__":
    sys.exit(main())
