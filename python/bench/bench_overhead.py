#!/usr/bin/env python3
"""Per-call overhead of the Python binding next to the C ABI's own cost, same loops and parameters.

    python python/bench/bench_overhead.py [--abi build/examples/abi_overhead] [--rounds 50]

admit_8192: add_sequence of an uncached 8,192-token prompt (64 per timed round, released unstored
between rounds); from Python with tokens as an int32 numpy array (read in place), as a prebuilt
Request, and as a list. add_token_256: add_token across 256 running sequences, 32 tokens each
(8,192 calls per timed round). Medians over rounds of the mean per call; examples/abi_overhead.cpp
is the C side. Timings only: nothing here is a test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

import kvblock

SEQS, RUNNING, STEPS = 64, 256, 32
ROOT = Path(__file__).resolve().parents[2]


def make_manager(blocks: int) -> kvblock.KVCacheManager:
    return kvblock.KVCacheManager(kvblock.ManagerConfig(
        [kvblock.WindowConfig(8192 + 64, blocks)], max_sequence_length=8192 + 64, tokens_per_block=32))


def bench_admit(rounds: int, form: str) -> float:
    prompt = np.arange(1, 8193, dtype=np.int32)
    prompt_list = prompt.tolist()
    requests = [kvblock.Request(i, prompt) for i in range(SEQS)]
    per_call = []
    with make_manager(SEQS * 8192 // 32 + 64) as m:
        add, remove = m.add_sequence, m.remove_sequence
        for round_ in range(rounds + 2):
            t0 = time.perf_counter_ns()
            if form == "numpy":
                for i in range(SEQS):
                    add(i, prompt)
            elif form == "request":
                for r in requests:
                    add(r)
            else:
                for i in range(SEQS):
                    add(i, prompt_list)
            ns = time.perf_counter_ns() - t0
            if round_ >= 2:
                per_call.append(ns / SEQS)
            for i in range(SEQS):
                remove(i, False)
    return statistics.median(per_call)


def bench_add_token(rounds: int) -> float:
    short = np.arange(1, 32, dtype=np.int32)
    per_call = []
    with make_manager(RUNNING * 4) as m:
        add_token = m.add_token
        ids = range(RUNNING)
        for round_ in range(rounds + 2):
            for i in ids:
                m.add_sequence(i, short)
            t0 = time.perf_counter_ns()
            for step in range(STEPS):
                for i in ids:
                    add_token(i, step)
            ns = time.perf_counter_ns() - t0
            if round_ >= 2:
                per_call.append(ns / (STEPS * RUNNING))
            for i in ids:
                m.remove_sequence(i, False)
    return statistics.median(per_call)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--abi", type=Path, default=ROOT / "build" / "examples" / "abi_overhead",
                   help="the C ABI program (examples/abi_overhead.cpp)")
    p.add_argument("--rounds", type=int, default=50)
    a = p.parse_args()
    c = {}
    if a.abi.exists():
        out = subprocess.run([str(a.abi), str(a.rounds)], check=True, capture_output=True, text=True).stdout
        c = {line.split()[0]: float(line.split()[1]) for line in out.splitlines() if line.strip()}
    rows = [
        ("add_sequence, 8,192 tokens, uncached: int32 numpy", bench_admit(a.rounds, "numpy"), c.get("admit_8192")),
        ("add_sequence, 8,192 tokens, uncached: Request", bench_admit(a.rounds, "request"), c.get("admit_8192")),
        ("add_sequence, 8,192 tokens, uncached: list", bench_admit(a.rounds, "list"), c.get("admit_8192")),
        ("add_token across 256 sequences", bench_add_token(a.rounds), c.get("add_token_256")),
    ]
    print(f"{'operation (median ns per call)':55} {'Python':>9} {'C ABI':>9} {'overhead':>9}")
    for name, py, abi in rows:
        abi_s = f"{abi:9.0f}" if abi is not None else "      n/a"
        over = f"{py - abi:9.0f}" if abi is not None else "      n/a"
        print(f"{name:55} {py:9.0f} {abi_s} {over}")

if __name__ == "__main__":
    main()
