"""The oracle: the same weights with no cache at all. Each sequence's full forward is recomputed
from its tokens in one pass, and every token the engine generated must be the greedy token of
these logits, with the logits within a relative tolerance."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import model


class WholeSequenceKV:
    """`kv` for model.forward over a whole sequence: a layer attends to the keys it just made."""

    def attend(self, layer, k, v, positions):
        return k, v, positions


@dataclass
class Verdict:
    tokens: int = 0  # generated tokens checked
    equal: int = 0  # of which the oracle's greedy token is the engine's
    max_rel_error: float = 0.0  # max over tokens of max|engine - oracle| / max|oracle|
    failures: int = 0  # tokens off, or logits beyond the tolerance


def check(cfg, weights, tokens: list[int], generated: dict[int, np.ndarray], verdict: Verdict,
          tolerance: float = 1e-4) -> None:
    """`generated`: position -> the engine's logits there (which chose tokens[position + 1])."""
    last = max(generated)
    seq = np.asarray(tokens[:last + 1], dtype=np.int64)
    logits = model.forward(cfg, weights, seq, np.arange(len(seq)), WholeSequenceKV(), all_logits=True)
    for pos, engine in generated.items():
        want = logits[pos]
        err = float(np.max(np.abs(engine - want)) / np.max(np.abs(want)))
        verdict.tokens += 1
        verdict.max_rel_error = max(verdict.max_rel_error, err)
        same = int(np.argmax(want)) == tokens[pos + 1]
        verdict.equal += same
        verdict.failures += (not same) or err > tolerance
