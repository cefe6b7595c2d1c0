#!/usr/bin/env python3
"""Prints the median time of every criterion benchmark found under target/criterion, with the
per-element time when the benchmark declared a throughput."""
import json
import pathlib
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target/criterion")
for est in sorted(root.glob("**/new/estimates.json")):
    bench = est.parent.parent.relative_to(root)
    median_ns = json.loads(est.read_text())["median"]["point_estimate"]
    line = f"{str(bench):60s} {median_ns / 1000:12.2f} us"
    meta = est.parent / "benchmark.json"
    if meta.exists():
        tp = json.loads(meta.read_text()).get("throughput") or {}
        n = tp.get("Elements") or tp.get("Bytes")
        if n:
            line += f"   {median_ns / n:9.1f} ns/element ({n} elements)"
    print(line)
