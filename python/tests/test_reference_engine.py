"""The reference engine (examples/engine), short: 120 requests of the bundled trace through
kvblock's pools, every generated token equal to the same model without a cache, and every event
the engine is built to exercise seen at least once."""

from __future__ import annotations

import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "examples" / "engine"
sys.path.insert(0, str(ENGINE))

import run  # noqa: E402


def test_reference_engine_equals_the_uncached_model():
    counts, verdict, _ = run.run(first=3700, count=120)
    assert verdict.tokens > 0 and verdict.failures == 0
    assert verdict.equal == verdict.tokens, f"tokens equal: {verdict.equal}/{verdict.tokens}"
    assert verdict.max_rel_error <= 1e-4
    assert counts["requests"] == 120
    for event in ("evictions", "offloads (to the host tier)", "onboards (from the host tier)", "partial reuses",
                  "partial copies (estimated)", "preemptions", "sliding-window detaches",
                  "prompt tokens reused (not recomputed)"):
        assert counts[event] > 0, f"{event}: {counts}"
