"""A small Llama-family decoder in numpy: RMSNorm, rotary position embeddings, grouped-query
attention, SwiGLU; deterministic random weights from a seed, float32.

The model does not know where its keys and values live: every layer hands its new K and V to a
`kv` object, which stores them and returns the keys and values the layer attends to (with their
positions). The engine's `kv` is kvblock's pools (pools.py); the oracle's is the sequence itself,
recomputed whole (oracle.py). Everything else is the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ModelConfig:
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 2
    head_size: int = 32
    hidden: int = 256
    ffn: int = 512
    vocab: int = 1024
    rope_theta: float = 10000.0
    eps: float = 1e-5
    # Attention window per layer: None = full attention, else the most recent positions a token
    # sees, itself included (Mistral / Gemma style sliding window). Two sizes, two kvblock windows.
    windows: tuple = (None, 32, None, 32)
    seed: int = 0
    # Multi-head latent attention (DeepSeek style) when > 0: a layer caches one row per token, a
    # compressed latent of `mla_latent` plus a shared rotary key of `mla_rope` (kvblock's K-only
    # pools); keys and values are expanded from the latent per head. 0: grouped-query attention.
    mla_latent: int = 0
    mla_rope: int = 16

    def window_of(self, layer: int, max_len: int) -> int:
        w = self.windows[layer]
        return max_len if w is None else w


@dataclass
class Weights:
    embed: np.ndarray
    layers: list = field(default_factory=list)
    norm: np.ndarray = None
    lm_head: np.ndarray = None


def init_weights(cfg: ModelConfig) -> Weights:
    """Deterministic random weights (normal, scaled by 1/sqrt(fan in))."""
    rng = np.random.default_rng(cfg.seed)

    def lin(n_in, n_out):
        return (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

    w = Weights(embed=rng.standard_normal((cfg.vocab, cfg.hidden)).astype(np.float32))
    for _ in range(cfg.num_layers):
        if cfg.mla_latent:
            nope = cfg.head_size - cfg.mla_rope
            w.layers.append(dict(
                attn_norm=(1 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32),
                wq=lin(cfg.hidden, cfg.num_heads * cfg.head_size),
                w_dkv=lin(cfg.hidden, cfg.mla_latent),
                w_kr=lin(cfg.hidden, cfg.mla_rope),
                w_uk=lin(cfg.mla_latent, cfg.num_heads * nope),
                w_uv=lin(cfg.mla_latent, cfg.num_heads * cfg.head_size),
                wo=lin(cfg.num_heads * cfg.head_size, cfg.hidden),
                ffn_norm=(1 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32),
                w_gate=lin(cfg.hidden, cfg.ffn),
                w_up=lin(cfg.hidden, cfg.ffn),
                w_down=lin(cfg.ffn, cfg.hidden),
            ))
            continue
        w.layers.append(dict(
            attn_norm=(1 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32),
            wq=lin(cfg.hidden, cfg.num_heads * cfg.head_size),
            wk=lin(cfg.hidden, cfg.num_kv_heads * cfg.head_size),
            wv=lin(cfg.hidden, cfg.num_kv_heads * cfg.head_size),
            wo=lin(cfg.num_heads * cfg.head_size, cfg.hidden),
            ffn_norm=(1 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32),
            w_gate=lin(cfg.hidden, cfg.ffn),
            w_up=lin(cfg.hidden, cfg.ffn),
            w_down=lin(cfg.ffn, cfg.hidden),
        ))
    w.norm = (1 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32)
    w.lm_head = lin(cfg.hidden, cfg.vocab)
    return w


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotary embedding of x [tokens, heads, head_size] at `positions` (rotate-half form)."""
    half = x.shape[-1] // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) / half)
    angles = positions.astype(np.float64)[:, None] * inv[None, :]
    cos = np.cos(angles).astype(np.float32)[:, None, :]
    sin = np.sin(angles).astype(np.float32)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(q, k, v, q_pos, k_pos, window: int | None) -> np.ndarray:
    """Grouped-query attention. q [n, H, D]; k, v [m, KV, D] at positions k_pos; causal, and with
    `window` only the `window` most recent positions (the query's own included)."""
    n, num_heads, d = q.shape
    num_kv = k.shape[1]
    group = num_heads // num_kv
    qg = q.reshape(n, num_kv, group, d).transpose(1, 2, 0, 3)  # [KV, group, n, D]
    kt = k.transpose(1, 2, 0)  # [KV, D, m]
    scores = (qg @ kt[:, None]) / np.float32(np.sqrt(d))  # [KV, group, n, m]
    visible = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - window
    scores = np.where(visible, scores, np.float32(-np.inf))
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ v.transpose(1, 0, 2)[:, None]  # [KV, group, n, D]
    return out.transpose(2, 0, 1, 3).reshape(n, num_heads * d)


def mla_attention(cfg: ModelConfig, lw: dict, h: np.ndarray, positions: np.ndarray, layer: int,
                  kv) -> np.ndarray:
    """Latent attention: the cached row of a token is [latent, rotary key] (one "head", K only);
    each head's key is its expansion of the latent and the shared rotary key, its value the
    latent's other expansion."""
    n, heads, d, r = len(h), cfg.num_heads, cfg.head_size, cfg.mla_rope
    nope = d - r
    q = (h @ lw["wq"]).reshape(n, heads, d)
    q = np.concatenate([q[..., :nope], rope(q[..., nope:], positions, cfg.rope_theta)], axis=-1)
    latent = h @ lw["w_dkv"]
    k_rope = rope((h @ lw["w_kr"]).reshape(n, 1, r), positions, cfg.rope_theta)
    row = np.concatenate([latent[:, None, :], k_rope], axis=-1)  # [n, 1, latent + rope]
    rows, _, key_pos = kv.attend(layer, row, None, positions)
    m = len(rows)
    c, kr = rows[:, 0, :cfg.mla_latent], rows[:, :, cfg.mla_latent:]
    keys = np.concatenate([(c @ lw["w_uk"]).reshape(m, heads, nope), np.broadcast_to(kr, (m, heads, r))],
                          axis=-1)
    values = (c @ lw["w_uv"]).reshape(m, heads, d)
    return attention(q, keys, values, positions, key_pos, cfg.windows[layer])


def forward(cfg: ModelConfig, w: Weights, tokens: np.ndarray, positions: np.ndarray, kv,
            all_logits: bool = False) -> np.ndarray:
    """Logits of the last token (or of every token) of a run of consecutive positions.

    `kv.attend(layer, k, v, positions)` stores the run's keys and values of `layer` and returns
    `(keys, values, key_positions)` the run attends to (its own included)."""
    x = w.embed[tokens]
    n = len(tokens)
    for i, lw in enumerate(w.layers):
        h = rms_norm(x, lw["attn_norm"], cfg.eps)
        if cfg.mla_latent:
            x = x + mla_attention(cfg, lw, h, positions, i, kv) @ lw["wo"]
            h = rms_norm(x, lw["ffn_norm"], cfg.eps)
            gate = h @ lw["w_gate"]
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ lw["w_up"])) @ lw["w_down"]
            continue
        q = rope((h @ lw["wq"]).reshape(n, cfg.num_heads, cfg.head_size), positions, cfg.rope_theta)
        k = rope((h @ lw["wk"]).reshape(n, cfg.num_kv_heads, cfg.head_size), positions, cfg.rope_theta)
        v = (h @ lw["wv"]).reshape(n, cfg.num_kv_heads, cfg.head_size)
        keys, values, key_pos = kv.attend(i, k, v, positions)
        x = x + attention(q, keys, values, positions, key_pos, cfg.windows[i]) @ lw["wo"]
        h = rms_norm(x, lw["ffn_norm"], cfg.eps)
        gate = h @ lw["w_gate"]
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ lw["w_up"])) @ lw["w_down"]
    x = rms_norm(x if all_logits else x[-1:], w.norm, cfg.eps)
    logits = x @ w.lm_head
    return logits if all_logits else logits[0]
