"""Shared helpers of the kvblock pytest suite."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

# On the simulated CUDA driver (cpp_tests/sim_cuda; scripts/test.sh sets KVB_SIM_CUDA_LIBRARY):
# loaded by its path before kvblock's first driver call, so that the loader's search for
# libcuda.so finds it already loaded (by its SONAME).
SIM_CUDA = (ctypes.CDLL(os.environ["KVB_SIM_CUDA_LIBRARY"], mode=ctypes.RTLD_GLOBAL)
            if os.environ.get("KVB_SIM_CUDA_LIBRARY") else None)

import kvblock  # noqa: E402  (after the simulated driver)

TPB = 4  # tokens per block in the small managers of the tests


def make_manager(primary: int = 16, secondary: int = 0, window: int = 256, **fields) -> kvblock.KVCacheManager:
    """A one-window manager with `TPB` tokens per block; `fields` override ManagerConfig fields."""
    fields.setdefault("tokens_per_block", TPB)
    fields.setdefault("max_sequence_length", window)
    config = kvblock.ManagerConfig([kvblock.WindowConfig(window, primary, secondary)], **fields)
    return kvblock.KVCacheManager(config)


def prompt(n: int, start: int = 1) -> np.ndarray:
    """n distinct int32 tokens from `start`."""
    return np.arange(start, start + n, dtype=np.int32)


def mark_prefill_computed(m: kvblock.KVCacheManager, rid: int) -> None:
    """Marks request `rid`'s known tokens computed (its whole prompt, or what its capacity covers),
    as an engine's prefill does before the request is stored or released for reuse: storing stops
    at the history (tokens whose KV is computed), so a request admitted and released with
    store_for_reuse without this stores only what it reused at admission. Uses `advance_history`,
    which stores nothing and emits no events (an engine that stores each chunk calls
    `store_context_blocks` instead)."""
    lengths = m.get_sequence_lengths(rid)
    m.advance_history(rid, min(lengths.num_tokens, lengths.capacity))


@pytest.fixture
def manager():
    with make_manager() as m:
        yield m
