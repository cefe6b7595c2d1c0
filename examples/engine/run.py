"""The reference engine: requests of the bundled Mooncake trace through kvblock's pools, every
generated token checked against the same model without a cache.

    .venv/bin/python examples/engine/run.py --svg engine.svg   # the full run, with its plot
    .venv/bin/python examples/engine/run.py --requests 120 --first 3700   # the pytest version
    .venv/bin/python examples/engine/run.py --backend cuda-torch   # KV in GPU memory (torch)
    .venv/bin/python examples/engine/run.py --remote redis://127.0.0.1:6379   # a shared remote tier
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import model  # noqa: E402
import oracle  # noqa: E402
import plot  # noqa: E402
import report  # noqa: E402
import workload  # noqa: E402
from scheduler import Engine, EngineConfig  # noqa: E402


def run(first: int = 3000, count: int = 993, engine_config: EngineConfig | None = None, seed: int = 0,
        svg: str | None = None, mla: bool = False):
    """Runs the engine and the oracle (and writes the plot to `svg`); returns (counts, verdict, seconds)."""
    t0 = time.perf_counter()
    cfg = model.ModelConfig(seed=seed, mla_latent=48 if mla else 0)
    weights = model.init_weights(cfg)
    engine = Engine(cfg, weights, engine_config or EngineConfig())
    reqs = workload.load(first, count, cfg.vocab)
    engine.run(reqs)
    verdict = oracle.Verdict()
    for r in engine.finished:
        oracle.check(cfg, weights, r.tokens, r.logits, verdict)
    counts = report.counts(engine)
    if svg:
        plot.write(svg, engine.trace)
    del engine.pools
    engine.m.close()
    if engine.driver:
        engine.driver.close()
    return counts, verdict, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--first", type=int, default=3000, help="first trace request (default 3000)")
    ap.add_argument("--requests", type=int, default=993, help="requests (default 993: the rest of the trace)")
    ap.add_argument("--seed", type=int, default=0, help="weights seed")
    ap.add_argument("--svg", metavar="PATH", help="writes a plot of the hit rate and tier traffic over steps")
    ap.add_argument("--backend", choices=("host", "cuda-torch", "cuda-driver"), default="host",
                    help="where the KV lives: host memory (default), GPU pools through torch, or GPU "
                         "pools through CUDA driver copies (no torch; KVB_SIM_CUDA_LIBRARY selects "
                         "the simulated driver)")
    ap.add_argument("--remote", metavar="URL", help="share prefixes through a Redis / Valkey server (redis://...)")
    ap.add_argument("--remote-password", default="", help="the server's password")
    ap.add_argument("--disk-dir", metavar="DIR", help="a disk tier below the host tier in DIR (kept: a second "
                                                      "run on the same DIR starts warm)")
    ap.add_argument("--disk-bytes", type=int, default=4 << 20, help="disk tier bytes per window")
    ap.add_argument("--mla", action="store_true",
                    help="multi-head latent attention: one K-only latent row per token (kvblock's "
                         "K-only pools) instead of grouped-query K and V")
    args = ap.parse_args()
    e = EngineConfig(backend=args.backend, remote=args.remote, remote_password=args.remote_password,
                     disk_dir=args.disk_dir, disk_bytes=args.disk_bytes)
    counts, verdict, seconds = run(args.first, args.requests, e, seed=args.seed, svg=args.svg, mla=args.mla)
    print(report.render(counts, verdict, seconds))
    return 0 if verdict.failures == 0 and verdict.tokens > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
