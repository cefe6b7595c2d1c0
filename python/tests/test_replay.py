"""The Python-driven peer replay (python/examples/replay_peer.py) reports the same reuse as the C++
replay (examples/replay.cpp --loop peer) on the same trace and parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "examples"))
import replay_peer  # noqa: E402

COUNTERS = ["steps", "prompt_tokens", "reused_prompt_tokens", "prompt_tokens_all_admissions",
            "reused_prompt_tokens_all_admissions", "admissions", "admission_failures", "preemptions",
            "hit_blocks", "new_prompt_blocks", "admitted_blocks", "decode_slots", "decode_new_blocks",
            "generated_tokens"]


def replay_binary() -> Path:
    """The C++ replay: $KVBLOCK_REPLAY (scripts/test.sh sets it, so it must exist), else build/."""
    explicit = os.environ.get("KVBLOCK_REPLAY")
    if explicit:
        return Path(explicit)
    default = ROOT / "build" / "examples" / "replay"
    if not default.exists():
        pytest.skip("build/examples/replay not built (cmake --build build); scripts/test.sh builds it")
    return default


def test_token_synthesis_matches_the_reference_values():
    assert int(replay_peer.splitmix64(replay_peer.np.array([0], dtype=replay_peer.np.uint64))[0]) == 0xE220A8397B1DCDAF
    tokens = replay_peer.prompt_tokens(list(range(79)), 40160)
    assert tokens[:6].tolist() == [15535, 22465, 28110, 3053, 11978, 22618]
    assert tokens[512:515].tolist() == [19302, 4121, 13274]
    assert replay_peer.output_token(0, 40160) == 13311
    assert replay_peer.output_token(5, 100) == 18955


@pytest.mark.parametrize(
    "limit, primary_blocks, max_output",
    [(200, 30000, 32), (200, 4400, 0)],
    ids=["reuse", "memory-pressure"],
)
def test_python_replay_equals_the_cpp_replay(tmp_path, limit, primary_blocks, max_output):
    binary = replay_binary()
    out = tmp_path / "replay.json"
    subprocess.run([str(binary), "--loop", "peer", "--trace", str(replay_peer.DEFAULT_TRACE), "--limit", str(limit),
                    "--primary-blocks", str(primary_blocks), "--max-output", str(max_output), "--quiet",
                    "--no-svg", "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
    cpp = json.loads(out.read_text())
    py = replay_peer.run(replay_peer.load_trace(replay_peer.DEFAULT_TRACE, limit), primary_blocks=primary_blocks,
                         max_output=max_output)
    assert {k: py.get(k, 0) for k in COUNTERS} == {k: cpp[k] for k in COUNTERS}
    assert py["reused_prompt_tokens"] > 0
    if primary_blocks == 4400:
        assert py["admission_failures"] > 0 and py["preemptions"] > 0
