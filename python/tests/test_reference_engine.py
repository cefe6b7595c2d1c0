"""The reference engine (examples/engine), short: 120 requests of the bundled trace through
kvblock's pools, every generated token equal to the same model without a cache, and every event
the engine is built to exercise seen at least once (suspensions whose blocks went to the host tier
and came back on resume included); and 40 requests without a host tier, where suspending cannot
help and the engine preempts instead. The same run on the CUDA backend: its GPU pools viewed
through DLPack and read with CUDA driver copies on the simulated driver (scripts/test.sh runs it
there), or as torch tensors on a real GPU."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "examples" / "engine"
sys.path.insert(0, str(ENGINE))

import run  # noqa: E402
from scheduler import EngineConfig  # noqa: E402


@functools.lru_cache(maxsize=None)
def host_run(mla: bool = False):
    return run.run(first=3700, count=30 if mla else 120, mla=mla)


def test_reference_engine_equals_the_uncached_model():
    counts, verdict, _ = host_run()
    assert verdict.tokens > 0 and verdict.failures == 0
    assert verdict.equal == verdict.tokens, f"tokens equal: {verdict.equal}/{verdict.tokens}"
    assert verdict.max_rel_error <= 1e-4
    assert counts["requests"] == 120
    for event in ("evictions", "offloads (to the host tier)", "onboards (from the host tier)", "partial reuses",
                  "partial copies (estimated)", "suspensions (KV kept, resumed later)", "resumes",
                  "blocks resumed from the host tier", "sliding-window detaches",
                  "prompt tokens reused (not recomputed)"):
        assert counts[event] > 0, f"{event}: {counts}"


def test_the_mla_engine_equals_the_uncached_model():
    """Multi-head latent attention: one K-only latent row per token and layer in kvblock's K-only
    pools (read through the layer map and the offset tables), reused, offloaded and onboarded."""
    counts, verdict, _ = host_run(mla=True)
    assert verdict.tokens > 0 and verdict.failures == 0
    assert verdict.equal == verdict.tokens, f"tokens equal: {verdict.equal}/{verdict.tokens}"
    for event in ("offloads (to the host tier)", "onboards (from the host tier)",
                  "prompt tokens reused (not recomputed)"):
        assert counts[event] > 0, f"{event}: {counts}"


def test_without_host_room_the_engine_preempts_instead_of_suspending():
    """No host tier: suspending cannot move a block, so the engine falls back to preemption (the
    request is released with its computed blocks stored and re-admitted, reusing them)."""
    counts, verdict, _ = run.run(first=3700, count=40, engine_config=EngineConfig(secondary_blocks=0))
    assert verdict.tokens > 0 and verdict.equal == verdict.tokens and verdict.failures == 0
    assert counts["preemptions (suspending could not help)"] > 0, counts
    assert counts["suspensions (KV kept, resumed later)"] == 0, counts


def test_without_host_room_a_suspended_request_that_cannot_resume_is_preempted():
    """No host tier and nothing left running: the suspended requests keep their blocks on the GPU
    and cannot resume, and nothing would free a block (these 60 requests never finished before
    the engine preempted them in that state)."""
    counts, verdict, _ = run.run(first=3000, count=60, engine_config=EngineConfig(secondary_blocks=0))
    assert verdict.tokens > 0 and verdict.equal == verdict.tokens and verdict.failures == 0
    assert counts["requests"] == 60
    assert counts["suspensions (KV kept, resumed later)"] > 0, counts
    assert counts["preemptions (suspending could not help)"] > 0, counts


def test_blocks_back_from_the_disk_tier_and_a_warm_restart_equal_the_uncached_model(tmp_path):
    """A host tier of 16 blocks over a disk tier: evicted blocks are written to disk and read back
    (verified) for later prefixes; a second engine on the same directory starts with the first
    one's disk cache. Every token equals the model without a cache, in both runs."""
    e = EngineConfig(secondary_blocks=16, disk_dir=str(tmp_path))
    cold, verdict, _ = run.run(first=3700, count=60, engine_config=e)
    assert verdict.tokens > 0 and verdict.equal == verdict.tokens and verdict.failures == 0
    assert cold["disk blocks written"] > 0 and cold["disk blocks read back (verified)"] > 0
    assert cold["disk slots recovered at start (warm)"] == 0 and cold["disk verify failures"] == 0
    warm, verdict, _ = run.run(first=3700, count=60, engine_config=e)
    assert verdict.tokens > 0 and verdict.equal == verdict.tokens and verdict.failures == 0
    assert warm["disk slots recovered at start (warm)"] > 0
    assert warm["disk blocks read back (verified)"] > 0 and warm["disk verify failures"] == 0


def check_same_run_as_host(backend: str, mla: bool = False) -> None:
    """The CUDA backend makes the same decisions as the host backend (the counts are equal) and
    its bytes give the same tokens: every offload, onboard, partial copy and resume moved the
    right rows, ordered before the next read. With `mla`, the K-only latent pools of the layer
    model (byte views of the GPU pools)."""
    counts, verdict, _ = run.run(first=3700, count=30 if mla else 120, mla=mla,
                                 engine_config=EngineConfig(backend=backend))
    assert verdict.tokens > 0 and verdict.failures == 0
    assert verdict.equal == verdict.tokens, f"tokens equal: {verdict.equal}/{verdict.tokens}"
    host_counts, host_verdict, _ = host_run(mla)
    assert counts == host_counts
    assert verdict.tokens == host_verdict.tokens


@pytest.mark.skipif(not os.environ.get("KVB_SIM_CUDA_LIBRARY"),
                    reason="KVB_SIM_CUDA_LIBRARY is not set (scripts/test.sh runs this on the simulated driver)")
@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_on_the_cuda_backend_through_dlpack_and_driver_copies(mla):
    check_same_run_as_host("cuda-driver", mla)


def torch_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not torch_cuda(), reason="needs torch with a CUDA GPU")
@pytest.mark.parametrize("mla", [False, True], ids=["gqa", "mla"])
def test_on_a_gpu_with_torch(mla):
    check_same_run_as_host("cuda-torch", mla)
