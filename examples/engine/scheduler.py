"""The engine loop: the engine iteration of docs/c-api.md with kvblock's calls, every forward pass
reading and writing the KV cache through kvblock's offset tables and pools.

Each step: (0) `resume` suspended requests, oldest first, while it says yes (when it says no and
nothing runs, nothing will free a block: the newest suspended request is preempted); (1) estimates for
the waiting requests, in order (none while a request is suspended: those come first); (2)
`add_sequence_batch` of those that fit, each prefilling from its `prepopulated_prompt_len` (reused
tokens are not recomputed); (3) for every decoding request `allocate_generation`, and when it
cannot be had, `suspend` the newest running request and retry (kvblock moves suspended blocks to
the host tier to make room; the request keeps its KV and resumes later) or, when suspending did not
help (no host room, only shared blocks), preempt it instead (released with its computed blocks
stored, re-admitted later, reusing them); then `add_token` of its last sampled token and
`store_new_block`; (4) `refresh_blocks`, the offset tables, the forward pass:
a chunk of each prefilling request within the step's token budget (chunked prefill) and one
token of each decoding one; (5) `store_context_blocks` after each chunk; (6) `remove_sequence`
with storing for finished requests; (7) `flush_iteration_events`. Evicted blocks are offloaded to
the host tier and onboarded when reused, by kvblock, inside these calls.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np

import kvblock
import model
import storage
from pools import ModelPools, Pools


@dataclass
class EngineConfig:
    tokens_per_block: int = 8
    max_len: int = 256  # max sequence length: the full-attention window
    primary_blocks: int = 32  # per window
    secondary_blocks: int = 120  # per window: the host tier
    max_running: int = 8
    token_budget: int = 48  # tokens per step (prefill chunks and decode tokens)
    # Where the KV lives: "host" (numpy over the host backend's pools), "cuda-torch" (GPU pools as
    # torch tensors, kvblock's copies on torch's current stream) or "cuda-driver" (GPU pools
    # through CUDA driver copies, kvblock's copies on the legacy default stream).
    backend: str = "host"
    # A shared remote tier: redis:// URL(s) of a Redis / Valkey server that engines with the same
    # model share prefixes through (None: none), and the server's password.
    remote: str | None = None
    remote_password: str = ""
    # A disk tier below the host tier in this directory (None: none), of this many bytes per
    # window; blocks the host tier evicts are written there and read back for later prefixes.
    disk_dir: str | None = None
    disk_bytes: int = 4 << 20


def manager_config(cfg: model.ModelConfig, e: EngineConfig) -> kvblock.ManagerConfig:
    """One kvblock window per attention-window size, with that window's layers."""
    layers = Counter(cfg.window_of(i, e.max_len) for i in range(cfg.num_layers))
    windows = [kvblock.WindowConfig(w, primary_blocks=e.primary_blocks, secondary_blocks=e.secondary_blocks,
                                    num_layers=n, num_kv_heads=cfg.num_kv_heads, size_per_head=cfg.head_size)
               for w, n in sorted(layers.items())]
    c = kvblock.ManagerConfig(windows, max_sequence_length=e.max_len, tokens_per_block=e.tokens_per_block,
                              bytes_per_element=4, copy_backend=kvblock.CopyBackend.HOST)
    if cfg.mla_latent:
        # One K-only row per token and layer: the latent and the rotary key, float32.
        c.layers = [kvblock.LayerSpec(cfg.window_of(i, e.max_len), kvblock.CacheType.SELF_K_ONLY, 1,
                                      cfg.mla_latent + cfg.mla_rope, kvblock.KvDataType.FP32)
                    for i in range(cfg.num_layers)]
    if e.backend == "cuda-torch":
        import torch

        c.copy_backend = kvblock.CopyBackend.CUDA
        c.cuda_device = torch.cuda.current_device()
        c.cuda_stream = torch.cuda.current_stream().cuda_stream
    elif e.backend == "cuda-driver":
        c.copy_backend = kvblock.CopyBackend.CUDA  # stream 0: the legacy default stream
    elif e.backend != "host":
        raise ValueError(f"unknown backend {e.backend!r}")
    if e.disk_dir:
        c.with_disk_tier(e.disk_dir, e.disk_bytes)
    if e.remote:
        # The model identity: engines share KV only with the same weights (seed) and geometry.
        c.with_remote_tier(e.remote, f"reference-engine-seed{cfg.seed}", e.remote_password)
    return c


def storage_of(e: EngineConfig, driver):
    if e.backend == "cuda-torch":
        return storage.TorchSlabs
    if e.backend == "cuda-driver":
        return lambda view: storage.DriverSlabs(view, driver.cu)
    return storage.HostSlabs


class Engine:
    def __init__(self, cfg: model.ModelConfig, weights, e: EngineConfig):
        self.cfg, self.w, self.e = cfg, weights, e
        self.driver = storage.Driver() if e.backend == "cuda-driver" else None
        self.m = kvblock.KVCacheManager(manager_config(cfg, e))
        pools = ModelPools if cfg.mla_latent else Pools
        self.pools = pools(self.m, cfg, e.max_len, e.tokens_per_block, storage_of(e, self.driver))
        self.swa_windows = sorted({w for w in cfg.windows if w is not None})
        self.waiting: deque = deque()
        self.running: list = []  # admission order
        self.suspended: list = []  # suspension order: resumed oldest first
        self.computed: dict = {}  # rid -> tokens whose KV is in the cache
        self.admitted_len: dict = {}  # rid -> tokens at admission (prefill runs up to there)
        self.detached: dict = {}  # rid -> {sliding window: front blocks out of the window}
        self.finished: list = []
        self.counts = Counter()
        self.steps = 0
        self.trace: list = []  # per step: (prefix hit rate, offloads, onboards), cumulative

    # -- (0): resume
    def resume(self) -> None:
        while self.suspended:
            r = self.suspended[0]
            moved = sum(self.m.get_block_info(w, b).cache_level == kvblock.CacheLevel.SECONDARY
                        for w in self.pools.pool_index for b in self.m.get_cache_block_ids(r.rid, w))
            if not self.m.resume(r.rid):  # above the utilization threshold, or its blocks do not fit
                if self.running:
                    return  # running requests finish and free blocks: try again next step
                # Nothing runs, so nothing will free a block (no host tier to move them to):
                # release the newest suspended request instead, as a preemption.
                self.preempt(self.suspended[-1])
                continue
            self.running.append(self.suspended.pop(0))  # its blocks are back in GPU memory
            self.counts["resumes"] += 1
            self.counts["resumed_blocks_from_host"] += moved

    # -- (1), (2): admission
    def admit(self) -> None:
        room = self.e.max_running - len(self.running)
        if room <= 0 or not self.waiting or self.suspended:
            return
        candidates = list(self.waiting)[:room]
        reqs = [kvblock.Request(r.rid, np.asarray(r.tokens, dtype=np.int32)) for r in candidates]
        if self.e.disk_dir:
            # The disk tier: finished reads become host blocks, the candidates' disk-resident
            # prefixes start reading (never waits); admit the leading ones whose blocks are in.
            self.m.disk_poll()
            self.m.disk_prefetch(reqs)
            ready = 0
            for req in reqs:
                if self.m.disk_blocks_in_flight(req) > 0:
                    break
                ready += 1
            if ready == 0:
                self.counts["disk_wait_steps"] += 1
                if not self.running:
                    time.sleep(0.0005)
                return
            candidates, reqs = candidates[:ready], reqs[:ready]
        if self.e.remote:
            # The remote tier: look up and fetch the candidates' prefixes (never waits); admit the
            # leading ones whose prefixes are in, the rest in a later step.
            ready = 0
            for p in self.m.remote_prefetch(reqs):
                if p.pending:
                    break
                ready += 1
            if ready == 0:
                self.counts["remote_wait_steps"] += 1
                if not self.running:
                    time.sleep(0.0005)
                return
            candidates, reqs = candidates[:ready], reqs[:ready]
        fits = 0
        for est in self.m.estimate_batch(reqs):
            if not est.fits:
                break
            fits += 1
        if fits == 0:
            return
        onboarded = self.m.get_kv_cache_stats().onboarded_blocks
        admissions = self.m.add_sequence_batch(reqs[:fits], longest_prefix=True)
        assert len(admissions) == fits, "admission delivers the estimate"
        copies = -(self.m.get_kv_cache_stats().onboarded_blocks - onboarded)
        tpb = self.e.tokens_per_block
        for r, a in zip(candidates, admissions):
            self.waiting.popleft()
            self.running.append(r)
            self.computed[r.rid] = a.prepopulated_prompt_len  # prefill starts here
            self.admitted_len[r.rid] = len(r.tokens)
            self.detached[r.rid] = {}
            self.counts["admissions"] += 1
            self.counts["reused_tokens"] += a.prepopulated_prompt_len
            if a.prepopulated_prompt_len % tpb:
                self.counts["partial_reuses"] += 1
            # Allocated beyond the misses: partial-reuse copy destinations and onboarded blocks.
            copies += a.stats.alloc_total_blocks - a.stats.missed_blocks
        self.counts["partial_copies"] += copies

    # -- (3): decode slots
    def preempt(self, r) -> None:
        """Releases r (running or suspended) with what it computed stored, to re-admit it later."""
        self.m.remove_sequence(r.rid, store_for_reuse=True)  # stores what was computed
        (self.suspended if r in self.suspended else self.running).remove(r)
        del self.computed[r.rid]
        self.waiting.appendleft(r)  # re-admitted first, with its generated tokens as prompt
        self.counts["preemptions"] += 1

    def make_room(self, r) -> bool:
        """Secures r's next token slot, suspending (or, failing that, preempting) the newest running
        requests; False when r itself had to go."""
        while not self.m.allocate_generation(r.rid):
            victim = self.running.pop()
            self.m.suspend(victim.rid)  # moves no data: its blocks may now go to the host tier
            self.suspended.append(victim)
            self.counts["suspensions"] += 1
            if victim is r:
                return False
            if self.m.allocate_generation(r.rid):  # kvblock moved the victim's blocks down
                return True
            self.counts["suspensions"] -= 1  # it did not help (no host room, or shared blocks):
            self.preempt(victim)  # release it instead
        return True

    def add_tokens(self) -> None:
        for r in list(self.running):
            if r not in self.running or self.computed[r.rid] < self.admitted_len[r.rid]:
                continue  # suspended or preempted meanwhile, or still prefilling
            if not self.make_room(r):
                continue
            before = self.window_fronts(r)
            self.m.add_token(r.rid, r.tokens[-1])  # its slot is allocated: it cannot run out
            self.m.store_new_block(r.rid)
            self.count_detaches(r, before)

    def window_fronts(self, r):
        """Per sliding window, the blocks the token about to be added pushes out of the window
        (all positions older than its window), with their references before add_token."""
        out = {}
        n, tpb = len(r.tokens), self.e.tokens_per_block
        for w in self.swa_windows:
            first, end = self.detached[r.rid].get(w, 0), max(0, (n - w) // tpb)
            if end > first:
                ids = self.m.get_cache_block_ids(r.rid, w)
                out[w] = [(b, self.m.get_block_info(w, b).ref_count) for b in ids[first:end]]
            self.detached[r.rid][w] = max(first, end)
        return out

    def count_detaches(self, r, before) -> None:
        """kvblock detaches those blocks from the sequence: one reference fewer each."""
        for w, blocks in before.items():
            for b, refs in blocks:
                if self.m.get_block_info(w, b).ref_count == refs - 1:
                    self.counts["swa_detaches"] += 1

    # -- (4), (5): the forward pass
    def forward(self) -> None:
        self.m.refresh_blocks()
        if not self.running:
            return
        ids = [r.rid for r in self.running]
        offsets = self.m.get_block_offsets_of_batch(ids)  # [pools][slots][K|V][blocks]
        decoding = [self.computed[r.rid] >= self.admitted_len[r.rid] for r in self.running]
        budget = self.e.token_budget - sum(decoding)  # decode tokens first, prefill chunks after
        for slot, r in enumerate(self.running):
            start = self.computed[r.rid]
            if decoding[slot]:
                end = start + 1
            else:
                end = min(self.admitted_len[r.rid], start + max(budget, 0))
                if end <= start:
                    continue
                budget -= end - start
            kv = self.pools.sequence(offsets[:, slot])
            logits = model.forward(self.cfg, self.w, np.asarray(r.tokens[start:end]), np.arange(start, end), kv)
            self.computed[r.rid] = end
            if decoding[slot]:
                self.counts["decode_tokens"] += 1
            else:
                self.m.store_context_blocks(r.rid, end)  # after each prefill chunk
                self.counts["prefill_tokens"] += end - start
            if end == len(r.tokens):  # the last known token: its logits choose the next one
                r.logits[end - 1] = logits
                r.tokens.append(int(np.argmax(logits)))

    # -- (6), (7)
    def release_finished(self) -> None:
        for r in list(self.running):
            if len(r.tokens) - len(r.prompt) >= r.max_new_tokens:
                self.m.remove_sequence(r.rid, store_for_reuse=True)
                self.running.remove(r)
                del self.computed[r.rid]
                self.finished.append(r)
        self.m.flush_iteration_events()

    def step(self) -> None:
        self.resume()
        self.admit()
        self.add_tokens()
        self.forward()
        self.release_finished()
        self.steps += 1
        s = self.m.get_kv_cache_stats()
        self.trace.append((s.cache_hit_rate, s.offloaded_blocks, s.onboarded_blocks))

    def run(self, requests, max_steps: int = 100_000) -> None:
        self.waiting.extend(requests)
        while (self.waiting or self.running or self.suspended) and self.steps < max_steps:
            self.step()
        assert not (self.waiting or self.running or self.suspended), "the run did not finish"
