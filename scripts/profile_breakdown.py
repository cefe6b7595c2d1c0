#!/usr/bin/env python3
"""Share of kvblock's time per C entry point and per leaf function, from a `perf record -g` profile
of the replay (scripts/profile_replay.sh runs both steps).

Only samples whose call chain passes through a `kvb_manager_*` entry point count: that is the time
inside the library, the replay's own loop and token synthesis are left out. Leaves outside the
library (memmove, malloc, page faults) are attributed by name.

    perf script -i perf.data | scripts/profile_breakdown.py [--top N]
"""
import collections
import re
import sys

top = 18
if "--top" in sys.argv:
    top = int(sys.argv[sys.argv.index("--top") + 1])

entries = collections.Counter()
leaves = collections.Counter()
total = 0
frames = []


def short(sym):
    sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
    sym = re.sub(r"<impl [^>]*>::", "", sym)
    sym = re.sub(r"::h[0-9a-f]{16}$", "", sym)
    return sym.replace("kvblock::", "")


def flush():
    global total, frames
    if frames:
        entry = next((f for f in reversed(frames) if f.startswith("kvb_manager_")), None)
        if entry is not None:
            total += 1
            entries[entry] += 1
            leaves[frames[0]] += 1
    frames = []


for line in sys.stdin:
    line = line.rstrip("\n")
    if not line.strip():
        flush()
        continue
    if not line.startswith((" ", "\t")):
        flush()
        continue
    parts = line.split(None, 1)
    if len(parts) == 2:
        sym = parts[1].rsplit(" (", 1)[0]
        frames.append(short(sym))
flush()

if total == 0:
    sys.exit("no samples inside kvb_manager_* entry points")
print(f"samples inside the library: {total}")
print("by entry point:")
for name, n in entries.most_common():
    print(f"  {100.0 * n / total:5.1f}%  {name}")
print(f"by leaf function (top {top}):")
for name, n in leaves.most_common(top):
    print(f"  {100.0 * n / total:5.1f}%  {name}")
