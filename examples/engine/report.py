"""What a run did: kvblock's counters, the engine's, and the oracle's verdict."""

from __future__ import annotations


def counts(engine) -> dict:
    s = engine.m.get_kv_cache_stats()
    c = engine.counts
    return {
        "requests": len(engine.finished),
        "steps": engine.steps,
        "prefill tokens computed": c["prefill_tokens"],
        "prompt tokens reused (not recomputed)": c["reused_tokens"],
        "decode tokens": c["decode_tokens"],
        "evictions": s.evicted_blocks,
        "offloads (to the host tier)": s.offloaded_blocks,
        "onboards (from the host tier)": s.onboarded_blocks,
        "partial reuses": c["partial_reuses"],
        "partial copies (estimated)": c["partial_copies"],
        "suspensions (KV kept, resumed later)": c["suspensions"],
        "resumes": c["resumes"],
        "blocks resumed from the host tier": c["resumed_blocks_from_host"],
        "preemptions (suspending could not help)": c["preemptions"],
        "sliding-window detaches": c["swa_detaches"],
        "prefix hit rate": round(s.cache_hit_rate, 3),
        **disk_counts(engine),
        **remote_counts(engine),
    }


def disk_counts(engine) -> dict:
    if not engine.m.has_disk_tier:
        return {}
    d = engine.m.get_disk_stats()
    return {
        "disk slots recovered at start (warm)": d.recovered,
        "disk blocks written": d.writes,
        "disk blocks read back (verified)": d.hits,
        "disk write drops (queue full)": d.write_drops,
        "disk verify failures": d.verify_failures,
        "steps waiting for the disk tier": engine.counts["disk_wait_steps"],
    }


def remote_counts(engine) -> dict:
    if not engine.m.has_remote_tier:
        return {}
    r = engine.m.get_remote_stats()
    return {
        "remote blocks placed (fetched, verified)": r.hits,
        "remote blocks written": r.writes,
        "remote values refused": r.verify_failures,
        "steps waiting for the remote tier": engine.counts["remote_wait_steps"],
    }


def render(counts: dict, verdict, seconds: float) -> str:
    lines = [f"{k:40s} {v}" for k, v in counts.items()]
    lines.append(f"{'max relative logit error':40s} {verdict.max_rel_error:.2e}")
    lines.append(f"{'time':40s} {seconds:.1f} s")
    lines.append(f"tokens equal to the uncached model: {verdict.equal}/{verdict.tokens}"
                 + ("" if verdict.failures == 0 else f"  ({verdict.failures} FAILED)"))
    return "\n".join(lines)
