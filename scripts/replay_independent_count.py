#!/usr/bin/env python3
"""Independent count of the prefix reuse the replay must report (python3 standard library only).

Setting: requests run strictly one after another (--max-running 1), capacity so large that nothing
is ever evicted, reuse of full blocks only (--no-partial-reuse). The script synthesises the same
tokens as the replay (the token rule of examples/replay/trace.hpp), models the reuse tree as
kvblock defines it, and compares the totals with the replay's JSON:

* Admission of a request with input length L looks up the blocks of its first L - 1 tokens (the
  last prompt token is never reused): the longest chain of stored blocks exactly equal to its full
  blocks, plus, at the end of that chain, a stored partial block exactly equal to its last, partial
  block (kvblock takes an exact partial match over even with partial reuse off, like TensorRT-LLM:
  the block leaves the tree and the request writes on in it). Reused tokens = the matched tokens.
* What is stored: after each prefill chunk the full blocks of the prompt minus its last token; at
  each decode step the full blocks of the sequence minus its last token; at release
  (remove_sequence with store) tokens[0 .. num_tokens - 1) with a partial last block, where
  num_tokens = L + T - 1 (the last generated token never gets a KV slot). Storing walks the tree
  from the root: an existing equal block is followed (the request's own copy stays private), the
  first missing one and everything after it are inserted.
* T = max(1, min(output_length, max_output)).

Checked: reused_prompt_tokens and prompt_tokens; hit_blocks (full shares + partial take-overs);
with events on, removed_hashes = partial take-overs (nothing is evicted); no offload, no preemption.

Usage: replay_independent_count.py --replay build/examples/replay [--trace PATH] [--limit 150]
           [--max-output 128] [--tokens-per-block 32] [--loop engine|peer] [--work-dir DIR]
       replay_independent_count.py --json out.json ...   (compare with an existing run instead)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MASK = (1 << 64) - 1
TRACE_BLOCK = 512
VOCAB = 32000


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def prompt_tokens(req):
    ids = req["hash_ids"]
    return [splitmix64((ids[i // TRACE_BLOCK] << 9) | (i % TRACE_BLOCK)) % VOCAB
            for i in range(req["input_length"])]


def output_token(r, p):
    return splitmix64((1 << 63) | (r << 32) | p) % VOCAB


def self_check():
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    first = prompt_tokens({"hash_ids": list(range(79)), "input_length": 40160})
    assert first[:6] == [15535, 22465, 28110, 3053, 11978, 22618]
    assert first[512:515] == [19302, 4121, 13274]
    assert output_token(0, 40160) == 13311 and output_token(5, 100) == 18955


class Block:
    """A KV block; in the tree it is a node whose children are keyed by their token tuples."""
    __slots__ = ("children", "in_tree")

    def __init__(self):
        self.children = {}
        self.in_tree = False


class Model:
    def __init__(self, tpb):
        self.tpb = tpb
        self.root = Block()
        self.root.in_tree = True

    def admit(self, tokens):
        """Returns (blocks of the sequence, reused tokens, reused blocks, take-overs)."""
        tpb, n = self.tpb, len(tokens)
        reusable = n - 1
        num_blocks = (n + tpb - 1) // tpb
        blocks, reused, takeovers = [], 0, 0
        parent = self.root
        while len(blocks) < num_blocks:
            start = len(blocks) * tpb
            end = min(start + tpb, reusable)
            if start >= end:
                break
            key = tuple(tokens[start:end])
            node = parent.children.get(key)
            if node is None:
                break
            if len(key) == tpb:  # exact full block: shared, descend
                blocks.append(node)
                reused += tpb
                parent = node
                continue
            # Exact partial block (an unreferenced leaf: one request at a time): taken over.
            del parent.children[key]
            node.in_tree = False
            blocks.append(node)
            reused += len(key)
            takeovers += 1
            break
        hits = len(blocks)
        while len(blocks) < num_blocks:
            blocks.append(Block())
        return blocks, reused, hits, takeovers

    def store(self, tokens, blocks, num_tokens, allow_partial):
        tpb = self.tpb
        parent, matching = self.root, True
        for i, block in enumerate(blocks):
            start, end = i * tpb, min((i + 1) * tpb, num_tokens)
            if start >= end or (not allow_partial and end - start < tpb):
                break
            key = tuple(tokens[start:end])
            node = parent.children.get(key) if matching else None
            if node is None:
                matching = False
                if block.in_tree or key in parent.children:
                    break
                parent.children[key] = block
                block.in_tree = True
                node = block
            parent = node


def independent_count(trace, max_output, tpb):
    model = Model(tpb)
    totals = {"prompt_tokens": 0, "reused_prompt_tokens": 0, "hit_blocks": 0, "takeovers": 0}
    for r, req in enumerate(trace):
        out = req["output_length"] if max_output == 0 else min(req["output_length"], max_output)
        T = max(1, out)
        tokens = prompt_tokens(req)
        L = len(tokens)
        blocks, reused, hits, takeovers = model.admit(tokens)
        totals["prompt_tokens"] += L
        totals["reused_prompt_tokens"] += reused
        totals["hit_blocks"] += hits
        totals["takeovers"] += takeovers
        model.store(tokens, blocks, L - 1, False)  # after the prompt (chunks store prefixes of it)
        # T - 1 decode steps each give the last sampled token a slot; the T-th token gets none.
        for _ in range(T - 1):
            tokens.append(output_token(r, len(tokens)))
            if (len(tokens) - 1) % tpb == 0:
                blocks.append(Block())
                model.store(tokens, blocks, len(tokens) - 1, False)
        assert len(blocks) == (len(tokens) + tpb - 1) // tpb
        model.store(tokens, blocks, len(tokens) - 1, True)  # remove_sequence(store_for_reuse)
    return totals


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", help="replay binary to run")
    ap.add_argument("--json", help="compare with this replay JSON instead of running the replay")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--trace", default=os.path.join(here, "..", "data", "mooncake_synthetic_trace.jsonl"))
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--tokens-per-block", type=int, default=32)
    ap.add_argument("--loop", choices=["engine", "peer"], default="engine")
    ap.add_argument("--work-dir", help="where the replay writes its JSON (default: a temporary dir)")
    args = ap.parse_args()
    if not args.replay and not args.json:
        ap.error("give --replay BINARY or --json PATH")

    self_check()
    trace = []
    with open(args.trace) as f:
        for line in f:
            if line.strip():
                trace.append(json.loads(line))
            if len(trace) == args.limit:
                break
    tpb = args.tokens_per_block
    expected = independent_count(trace, args.max_output, tpb)

    if args.json:
        json_path = args.json
    else:
        work = args.work_dir or tempfile.mkdtemp(prefix="replay_count_")
        os.makedirs(work, exist_ok=True)
        json_path = os.path.join(work, "replay.json")
        # Capacity that never evicts: every block every request could ever allocate, plus slack.
        capacity = sum((t["input_length"] + max(t["output_length"], 1) + tpb) // tpb + 1 for t in trace) + 64
        cmd = [args.replay, "--trace", args.trace, "--limit", str(args.limit),
               "--max-output", str(args.max_output), "--tokens-per-block", str(tpb),
               "--loop", args.loop, "--max-running", "1", "--no-partial-reuse",
               "--primary-blocks", str(capacity), "--secondary-blocks", "0",
               "--json", json_path, "--no-svg", "--quiet"]
        print("+ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    with open(json_path) as f:
        got = json.load(f)

    cfg = got["config"]
    assumed = {"max_running": 1, "partial_reuse": False, "tokens_per_block": tpb,
               "max_output": args.max_output, "requests": len(trace)}
    wrong = {k: cfg.get(k) for k, v in assumed.items() if cfg.get(k) != v}
    if wrong:
        print(f"FAILED: the replay ran with {wrong}, the count assumes {assumed}", file=sys.stderr)
        return 1
    checks = [
        ("prompt_tokens", expected["prompt_tokens"], got["prompt_tokens"]),
        ("reused_prompt_tokens", expected["reused_prompt_tokens"], got["reused_prompt_tokens"]),
        ("hit_blocks", expected["hit_blocks"], got["hit_blocks"]),
        ("preemptions", 0, got["preemptions"]),
        ("offloaded blocks", 0, got["blocks"]["offloaded"]),
    ]
    if got["events"]["enabled"]:
        checks.append(("removed hashes = partial take-overs", expected["takeovers"],
                       got["events"]["removed_hashes"]))
    ok = True
    for name, want, have in checks:
        good = want == have
        ok &= good
        print(f"{name:40s} independent {want:>12}  replay {have:>12}  {'ok' if good else 'MISMATCH'}")
    print(f"requests {len(trace)}, partial take-overs {expected['takeovers']}, "
          f"hit rate {expected['reused_prompt_tokens'] / max(expected['prompt_tokens'], 1):.4f}")
    if not ok:
        print("FAILED: the replay's reuse differs from the independent count", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
