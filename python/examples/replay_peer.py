#!/usr/bin/env python3
"""The peer replay loop of examples/replay.cpp (``--loop peer``), driven from Python.

Same trace format, token synthesis, scheduling and counters as the C++ replay, so on the same trace
and parameters both report the same reuse (pytest checks it: python/tests/test_replay.py).

    python python/examples/replay_peer.py --limit 200 --primary-blocks 4400 --max-output 0

Loop per step: (A) each running request decodes one slot (``add_token`` of its last token, then
``store_new_block``); on OutOfBlocksError the most recently admitted running request is preempted
(``remove_sequence`` with store) and re-queued at the front, and the slot retried; (B) if nothing was
preempted, waiting requests are admitted whole in order (``add_sequence`` + ``store_context_blocks``)
while a slot is free and they fit; (C) every scheduled request samples a token; finished ones are
released with store for reuse.
"""

from __future__ import annotations

import argparse
import collections
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import kvblock

TRACE_BLOCK_TOKENS = 512
VOCAB = 32000
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic_trace.jsonl"
_MASK = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 of each uint64 (wrapping arithmetic, as in examples/replay/trace.hpp)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def prompt_tokens(hash_ids: list[int], input_length: int) -> np.ndarray:
    """Prompt token i = splitmix64((hash_ids[i // 512] << 9) | (i % 512)) % 32000."""
    i = np.arange(input_length, dtype=np.uint64)
    ids = np.asarray(hash_ids, dtype=np.uint64)[i // np.uint64(TRACE_BLOCK_TOKENS)]
    x = (ids << np.uint64(9)) | (i % np.uint64(TRACE_BLOCK_TOKENS))
    return (splitmix64(x) % np.uint64(VOCAB)).astype(np.int32)


def output_token(r: int, p: int) -> int:
    """Generated token of request r at sequence position p."""
    x = np.array([((1 << 63) | (r << 32) | p) & _MASK], dtype=np.uint64)
    return int(splitmix64(x)[0] % np.uint64(VOCAB))


@dataclass
class Req:
    r: int
    trace: dict
    T: int
    tokens: list[int] = field(default_factory=list)
    generated: int = 0
    admitted_once: bool = False
    done: bool = False


def load_trace(path: Path, limit: int | None) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if limit is not None and len(out) >= limit:
                    break
    return out


def run(trace: list[dict], *, primary_blocks: int = 30000, tokens_per_block: int = 32, max_running: int = 64,
        max_output: int = 128, partial_reuse: bool = True) -> dict[str, int]:
    """Replays `trace` through the peer loop; returns the C++ replay's counters (its JSON names)."""
    reqs = []
    for r, t in enumerate(trace):
        cap = min(t["output_length"], max_output) if max_output > 0 else t["output_length"]
        reqs.append(Req(r, t, max(1, cap)))
    max_sequence_length = max([1] + [q.trace["input_length"] + q.T for q in reqs])
    config = kvblock.ManagerConfig(
        [kvblock.WindowConfig(max_sequence_length, primary_blocks)],
        max_sequence_length=max_sequence_length, tokens_per_block=tokens_per_block, max_beam_width=1,
        enable_partial_reuse=partial_reuse, bytes_per_element=1)
    c = collections.Counter()
    waiting = collections.deque(reqs)
    running: list[Req] = []

    with kvblock.KVCacheManager(config) as m:
        def decode_slot(q: Req) -> tuple[bool, bool]:
            """(slot obtained, something was preempted)."""
            preempted = False
            while True:
                try:
                    m.add_token(q.r, q.tokens[-1])
                    break
                except kvblock.OutOfBlocksError:
                    victim = running.pop()
                    m.remove_sequence(victim.r, True)
                    c["preemptions"] += 1
                    waiting.appendleft(victim)
                    preempted = True
                    if victim is q:
                        return False, True
            if (len(q.tokens) - 1) % tokens_per_block == 0:
                c["decode_new_blocks"] += 1
            m.store_new_block(q.r)
            return True, preempted

        def admit(q: Req) -> bool:
            if not q.tokens:
                q.tokens = prompt_tokens(q.trace["hash_ids"], q.trace["input_length"]).tolist()
            n = len(q.tokens)
            try:
                a = m.add_sequence(q.r, np.asarray(q.tokens, dtype=np.int32))
            except kvblock.OutOfBlocksError:
                c["admission_failures"] += 1
                if not running:
                    raise RuntimeError(f"request {q.r} ({n} tokens) does not fit with nothing running")
                return False
            c["admissions"] += 1
            c["hit_blocks"] += a.stats.reused_blocks
            c["new_prompt_blocks"] += a.stats.missed_blocks
            c["admitted_blocks"] += -(-n // tokens_per_block)
            c["prompt_tokens_all_admissions"] += n
            c["reused_prompt_tokens_all_admissions"] += a.prepopulated_prompt_len
            if not q.admitted_once:
                q.admitted_once = True
                c["prompt_tokens"] += n
                c["reused_prompt_tokens"] += a.prepopulated_prompt_len
            m.store_context_blocks(q.r, n)
            return True

        while waiting or running:
            c["steps"] += 1
            scheduled = []
            preempted = False
            for q in list(running):  # A. decode (running shrinks on preemption)
                if q not in running:
                    break
                c["decode_slots"] += 1
                ok, p = decode_slot(q)
                preempted = preempted or p
                if not ok:
                    break
                scheduled.append(q)
            if not preempted:  # B. admission, head-of-line blocking
                while waiting and len(running) < max_running:
                    q = waiting[0]
                    if not admit(q):
                        break
                    waiting.popleft()
                    running.append(q)
                    scheduled.append(q)
            for q in scheduled:  # C. sample, release finished
                q.tokens.append(output_token(q.r, len(q.tokens)))
                q.generated += 1
                c["generated_tokens"] += 1
                if q.generated >= q.T:
                    m.remove_sequence(q.r, True)
                    q.done = True
                    q.tokens = []
            running[:] = [q for q in running if not q.done]
        m.check_invariants()
        stats = m.get_kv_cache_stats()
        if stats.free_num_blocks != primary_blocks:
            raise RuntimeError(f"{primary_blocks - stats.free_num_blocks} blocks still in use at the end")
    return dict(c)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--primary-blocks", type=int, default=30000)
    p.add_argument("--tokens-per-block", type=int, default=32)
    p.add_argument("--max-running", type=int, default=64)
    p.add_argument("--max-output", type=int, default=128)
    p.add_argument("--no-partial-reuse", action="store_true")
    a = p.parse_args()
    counters = run(load_trace(a.trace, a.limit), primary_blocks=a.primary_blocks,
                   tokens_per_block=a.tokens_per_block, max_running=a.max_running, max_output=a.max_output,
                   partial_reuse=not a.no_partial_reuse)
    print(json.dumps(counters, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
