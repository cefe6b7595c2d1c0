"""Requests from the bundled Mooncake trace, scaled down.

The trace gives each request the ids of its 512-token prompt blocks; equal ids are equal prefix
blocks. The replay (examples/replay.cpp, python/examples/replay_peer.py) turns id h at offset o
into token splitmix64((h << 9) | o) % vocabulary. Here a trace block stands for
`tokens_per_trace_block` tokens instead of 512 (and prompts keep at most `max_trace_blocks` of
them), so prefixes are shared exactly as in the trace, at a size numpy computes in seconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic_trace.jsonl"


def splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@dataclass
class Request:
    rid: int
    prompt: np.ndarray
    max_new_tokens: int
    tokens: list = field(default_factory=list)  # prompt + generated (the last one not in the cache yet)
    logits: dict = field(default_factory=dict)  # position -> the logits that chose tokens[position + 1]


def load(first: int, count: int, vocab: int, tokens_per_trace_block: int = 12, max_trace_blocks: int = 14,
         max_new_tokens: int = 12) -> list[Request]:
    out = []
    with open(TRACE) as f:
        lines = [line for line in f if line.strip()][first:first + count]
    for i, line in enumerate(lines):
        r = json.loads(line)
        ids = r["hash_ids"][:max_trace_blocks]
        n = min(-(-r["input_length"] * tokens_per_trace_block // 512), len(ids) * tokens_per_trace_block)
        n = max(n, 2)
        pos = np.arange(n, dtype=np.uint64)
        x = (np.asarray(ids, dtype=np.uint64)[pos // np.uint64(tokens_per_trace_block)] << np.uint64(9)) | (
            pos % np.uint64(tokens_per_trace_block))
        prompt = (splitmix64(x) % np.uint64(vocab)).astype(np.int32)
        out.append(Request(rid=first + i, prompt=prompt,
                           max_new_tokens=max(1, min(r["output_length"], max_new_tokens)),
                           tokens=prompt.tolist()))
    return out
