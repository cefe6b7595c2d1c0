"""The reference engine split in two processes: a prefill engine computes each prompt's KV into
its own kvblock pools and pushes it over NIXL straight into the decode engine's pools, where the
decode engine generates the rest; every generated token is checked against the same model
without a cache (oracle.py).

    source scripts/nixl_env.sh   # KVBLOCK_NIXL_LIBRARY, UCX_MODULES
    .venv/bin/python examples/engine/disagg.py --requests 30

This process is the decode engine; the prefill engine is a child process (multiprocessing,
spawned), killed on every exit path. The control channel is a multiprocessing Pipe (metadata,
layouts, tickets, prompts, first tokens); the KV moves only over NIXL. Both managers have the
same pool configuration (scheduler.manager_config), so the layout plan is Identical: each side
checks the other's layout blob (every pool's geometry, addresses aside) equals its own.

Per request, one at a time: the decode engine admits it with `add_sequence_receiving` (local
reuse: its cached prefix, whole blocks, is not sent again: the ticket's skip), sends the ticket
and the prompt; the prefill engine admits the prompt (its own reuse), runs the prefill through
its pools, chooses the first token, `begin_send(id, skip, prompt length)`, removes the sequence
(stored), `post_send(..., notification=id)`, polls to DONE and replies with the first token's
logits; the decode engine takes the notification, `complete_receive`, appends the first token and
decodes the rest one token a step (`allocate_generation`, `add_token`, `store_new_block`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import struct
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kvblock  # noqa: E402
import model  # noqa: E402
import oracle  # noqa: E402
import workload  # noqa: E402
from pools import Pools  # noqa: E402
from scheduler import EngineConfig, manager_config  # noqa: E402


class NixlMissing(RuntimeError):
    """attach_nixl said NIXL's library is not there."""


def engine_config() -> EngineConfig:
    # No host tier: begin_send refuses blocks on the host tier, and one request at a time never
    # needs it. 64 GPU blocks of 8 tokens per window on both sides.
    return EngineConfig(primary_blocks=64, secondary_blocks=0)


def ticket_fields(ticket: bytes) -> tuple[int, int, int]:
    """(request id, tokens the sender skips, prompt tokens) of a receive ticket blob: its fixed
    header after the magic "KVBT" and the version (src/disagg/ticket.rs)."""
    assert ticket[:4] == b"KVBT", "not a receive ticket"
    return struct.unpack_from("<QQQ", ticket, 8)


def ticket_windows(ticket: bytes) -> list[tuple[int, int, int]]:
    """Per window of a receive ticket: (window size, first block index, receiving rows)."""
    (n,) = struct.unpack_from("<I", ticket, 32)
    out, at = [], 36
    for _ in range(n):
        window, first, rows = struct.unpack_from("<QQI", ticket, at)
        out.append((window, first, rows))
        at += 20 + 4 * rows
    return out


def layout_geometry(blob: bytes) -> tuple:
    """A layout blob (src/disagg/layout.rs) without the pools' base addresses: what must be equal
    on both sides for rows to move whole."""
    assert blob[:4] == b"KVBL", "not a layout"
    version, tpb, rank, size, n = struct.unpack_from("<5I", blob, 4)
    pools, at = [], 24
    for _ in range(n):
        window, row_bytes, rows, _base = struct.unpack_from("<4Q", blob, at)
        pools.append((window, row_bytes, rows) + struct.unpack_from("<9I", blob, at + 32))
        at += 32 + 36
    devices = struct.unpack_from(f"<{n}i", blob, at)
    return version, tpb, rank, size, tuple(pools), devices


def new_engine(seed: int, agent: str, timeout_ms: int, contiguous_runs: bool = False):
    cfg = model.ModelConfig(seed=seed)
    e = engine_config()
    m = kvblock.KVCacheManager(manager_config(cfg, e))
    m.set_contiguous_runs(contiguous_runs)  # rows in runs: fewer descriptors a transfer
    try:
        m.attach_nixl(agent, timeout_ms=timeout_ms)
    except kvblock.UnsupportedError as err:
        m.close()
        raise NixlMissing(str(err)) from err
    return cfg, model.init_weights(cfg), m, Pools(m, cfg, e.max_len, e.tokens_per_block)


def receive(conn, deadline: float, what: str):
    if not conn.poll(max(0.0, deadline - time.monotonic())):
        raise TimeoutError(f"no {what} from the peer engine in time")
    msg = conn.recv()
    if msg[0] == "error":
        raise RuntimeError(f"the peer engine failed: {msg[1]}")
    return msg


def stats_dict(s) -> dict:
    return {k: getattr(s, k) for k in dir(s) if not k.startswith("_")}


# ---- the prefill engine (the child process) ------------------------------------------------

def prefill_main(conn, seed: int, timeout_s: float, contiguous_runs: bool) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        prefill_serve(conn, seed, deadline, contiguous_runs)
    except BaseException as err:  # the decode engine learns why, then this process ends
        try:
            conn.send(("error", f"{type(err).__name__}: {err}"))
        except OSError:
            pass
        raise


def prefill_serve(conn, seed: int, deadline: float, contiguous_runs: bool) -> None:
    cfg, w, m, pools = new_engine(seed, "prefill", 10_000, contiguous_runs)
    conn.send(("hello", m.transfer_metadata(), m.export_layout()))
    _, peer_md, peer_layout = receive(conn, deadline, "metadata")
    assert layout_geometry(peer_layout) == layout_geometry(m.export_layout()), "layouts differ"
    peer = m.add_transfer_peer(peer_md)
    reused = 0
    while True:
        msg = receive(conn, deadline, "request")
        if msg[0] == "stop":
            break
        _, rid, prompt, ticket = msg
        ticket_rid, skip, n = ticket_fields(ticket)
        assert (ticket_rid, n) == (rid, len(prompt)), "the ticket is another request's"
        start = m.add_sequence(rid, prompt).prepopulated_prompt_len  # this side's own reuse
        reused += start
        m.refresh_blocks()
        offsets = m.get_block_offsets_of_batch([rid])
        logits = model.forward(cfg, w, prompt[start:], np.arange(start, n), pools.sequence(offsets[:, 0]))
        m.store_context_blocks(rid, n)
        lease = m.begin_send(rid, skip, n)
        m.remove_sequence(rid, store_for_reuse=True)  # the lease keeps the rows until DONE
        m.post_send(lease, peer, peer_layout, ticket, b"%d" % rid)
        while not (events := m.poll_transfers()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {rid}: the transfer did not settle in time")
            time.sleep(0.0005)
        assert events == [(lease, kvblock.TransferOutcome.DONE)], events
        conn.send(("first", rid, logits, n - start))
    conn.send(("stats", stats_dict(m.transfer_stats()), reused))
    del pools
    m.close()


# ---- the decode engine (this process) -------------------------------------------------------

def requests(first: int, count: int, vocab: int, tpb: int) -> list[workload.Request]:
    """Trace requests, and every third one a follow-up of an earlier prompt: a prefix of it (not
    a whole number of blocks, or all of it) and new tokens, so the decode engine already holds
    part of its KV (the trace itself shares few prefixes among neighbours)."""
    base = workload.load(first, count - count // 3, vocab)
    out, rng = [], np.random.default_rng(first)
    for i, r in enumerate(base):
        out.append(r)
        if i % 2 == 1 and len(out) < count:
            src = base[i - 1].prompt
            keep = len(src) if i % 4 == 3 else max(1, (len(src) * 2) // 3 + tpb // 2)
            tail = rng.integers(0, vocab, size=int(rng.integers(3, 20)), dtype=np.int32)
            prompt = np.concatenate([src[:keep], tail]).astype(np.int32)
            out.append(workload.Request(rid=10_000_000 + r.rid, prompt=prompt, max_new_tokens=8,
                                        tokens=prompt.tolist()))
    return out[:count]


def decode_one(m, cfg, w, pools, conn, r, counts: Counter, deadline: float) -> None:
    n, tpb = len(r.prompt), pools.tpb
    a = m.add_sequence_receiving(kvblock.Request(r.rid, np.asarray(r.prompt, dtype=np.int32)))
    ticket = m.receive_ticket(r.rid)
    _, skip, _ = ticket_fields(ticket)
    assert skip == a.prepopulated_prompt_len // tpb * tpb, (skip, a.prepopulated_prompt_len)
    counts["decode-side reused tokens"] += a.prepopulated_prompt_len
    counts["requests with skip_tokens > 0"] += skip > 0
    counts["tokens skipped (decode-side cache)"] += skip
    counts["tokens received"] += n - skip
    for window, first, rows in ticket_windows(ticket):
        counts[f"rows received, {window}-token window"] += rows
        # Rows this request's sliding-window layers never read: wholly before the last `window`
        # prompt positions (decode reads [position - window + 1, position]).
        if window < engine_config().max_len:
            outside = max(0, max(0, n - window) // tpb - first)
            counts[f"rows received, {window}-token window, out of it at decode"] += outside
    conn.send(("prefill", r.rid, np.asarray(r.prompt, dtype=np.int32), ticket))
    reply = None  # the prefill engine's reply may come before the notification is taken
    while (note := m.take_transfer_notification()) is None:
        if reply is None and conn.poll():
            reply = receive(conn, deadline, "first token")  # raises on the prefill side's error
        if time.monotonic() > deadline:
            raise TimeoutError(f"request {r.rid}: no notification in time")
        time.sleep(0.0005)
    assert note == ("prefill", b"%d" % r.rid), note
    m.complete_receive(r.rid)
    _, rid, logits, computed = reply or receive(conn, deadline, "first token")
    assert rid == r.rid
    counts["prefill tokens computed"] += computed
    r.logits[n - 1] = logits
    r.tokens.append(int(np.argmax(logits)))
    while len(r.tokens) - n < r.max_new_tokens:
        assert m.allocate_generation(r.rid), "one request at a time always has room"
        m.add_token(r.rid, r.tokens[-1])
        m.store_new_block(r.rid)
        m.refresh_blocks()
        offsets = m.get_block_offsets_of_batch([r.rid])
        pos = len(r.tokens) - 1
        logits = model.forward(cfg, w, np.asarray(r.tokens[pos:]), np.arange(pos, pos + 1),
                               pools.sequence(offsets[:, 0]))
        r.logits[pos] = logits
        r.tokens.append(int(np.argmax(logits)))
        counts["decode tokens"] += 1
    m.remove_sequence(r.rid, store_for_reuse=True)
    m.flush_iteration_events()


def run(first: int = 3700, count: int = 30, seed: int = 0, timeout_s: float = 120.0,
        contiguous_runs: bool = False):
    """Both engines, `count` requests; returns (counts, (the prefill side's transfer stats, the
    decode side's), verdict, seconds). Raises NixlMissing when NIXL's library is not there."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    cfg, w, m, pools = new_engine(seed, "decode", 10_000, contiguous_runs)
    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=prefill_main, args=(child_conn, seed, timeout_s, contiguous_runs),
                        daemon=True)
    counts: Counter = Counter()
    try:
        child.start()
        child_conn.close()
        _, peer_md, peer_layout = receive(conn, deadline, "metadata")
        assert layout_geometry(peer_layout) == layout_geometry(m.export_layout()), "layouts differ"
        conn.send(("hello", m.transfer_metadata(), m.export_layout()))
        assert m.add_transfer_peer(peer_md) == "prefill"
        reqs = requests(first, count, cfg.vocab, pools.tpb)
        for r in reqs:
            decode_one(m, cfg, w, pools, conn, r, counts, deadline)
        conn.send(("stop",))
        _, sent, prefill_reused = receive(conn, deadline, "stats")
        child.join(max(0.0, deadline - time.monotonic()))
        assert child.exitcode == 0, f"the prefill engine exited with {child.exitcode}"
        got = stats_dict(m.transfer_stats())
        del pools
        m.close()
    finally:  # on an error, the traceback's frames keep the pool views: the manager goes with them
        if child.is_alive():
            child.kill()
        child.join(5)
        conn.close()
    verdict = oracle.Verdict()
    for r in reqs:
        oracle.check(cfg, w, r.tokens, r.logits, verdict)
    out = {
        "requests": len(reqs),
        "requests with skip_tokens > 0": counts["requests with skip_tokens > 0"],
        "prompt tokens received (over NIXL)": counts["tokens received"],
        "prompt tokens skipped (decode-side cache)": counts["tokens skipped (decode-side cache)"],
        "decode-side reused prompt tokens": counts["decode-side reused tokens"],
        **{k: v for k, v in sorted(counts.items()) if k.startswith("rows received")},
        "prefill-side reused prompt tokens": prefill_reused,
        "prefill tokens computed": counts["prefill tokens computed"],
        "decode tokens": counts["decode tokens"],
        "transfers posted / done": f"{sent['transfers_posted']} / {sent['transfers_done']}",
        "transfers failed / timed out": f"{sent['transfers_failed']} / {sent['transfers_timed_out']}",
        "descriptors unmerged / posted": f"{sent['descriptors_unmerged']} / {sent['descriptors_posted']}",
        "bytes posted": sent["bytes_posted"],
        "receives completed / aborted": f"{got['receives_completed']} / {got['receives_aborted']}",
        "quarantined holds (prefill / decode)": f"{sent['quarantined_holds']} / {got['quarantined_holds']}",
        "active leases, receiving requests": f"{sent['active_leases']}, {got['receiving_requests']}",
    }
    return out, (sent, got), verdict, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--first", type=int, default=3700, help="first trace request (default 3700)")
    ap.add_argument("--requests", type=int, default=30, help="requests (default 30)")
    ap.add_argument("--seed", type=int, default=0, help="weights seed")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run")
    ap.add_argument("--contiguous-runs", action="store_true",
                    help="both managers prefer allocating rows in runs (fewer, larger descriptors)")
    args = ap.parse_args()
    try:
        counts, _, verdict, seconds = run(args.first, args.requests, args.seed, args.timeout,
                                              args.contiguous_runs)
    except NixlMissing as err:
        print(f"NIXL is missing: {err} (source scripts/nixl_env.sh)", file=sys.stderr)
        return 2
    for k, v in counts.items():
        print(f"{k:51s} {v}")
    print(f"{'max relative logit error':51s} {verdict.max_rel_error:.2e}")
    print(f"{'time':51s} {seconds:.1f} s")
    print(f"tokens equal to the uncached model: {verdict.equal}/{verdict.tokens}"
          + ("" if verdict.failures == 0 else f"  ({verdict.failures} FAILED)"))
    return 0 if verdict.failures == 0 and verdict.tokens > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
