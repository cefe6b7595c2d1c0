"""The reference engine (examples/engine) with a shared remote tier on a real redis-server: one
engine process computes 40 requests of the bundled trace and writes their blocks; a second engine
(this process) runs the same requests, fetching the prefixes the first computed, and every token
it generates equals the same model without a cache. Fails when redis-server is not installed (scripts/setup.sh installs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from redis_helper import INSTALLED, MISSING, PASSWORD, redis_server

ENGINE = Path(__file__).resolve().parents[2] / "examples" / "engine"
sys.path.insert(0, str(ENGINE))

import run  # noqa: E402
from scheduler import EngineConfig  # noqa: E402



@pytest.fixture(autouse=True)
def redis_is_installed():
    assert INSTALLED, MISSING

FIRST, COUNT = 3700, 40


def test_two_engine_processes_share_prefixes_and_equal_the_uncached_model():
    with redis_server() as url:
        first = subprocess.run([sys.executable, str(ENGINE / "run.py"), "--first", str(FIRST), "--requests",
                                str(COUNT), "--remote", url, "--remote-password", PASSWORD],
                               capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "remote blocks written" in first.stdout
        counts, verdict, _ = run.run(first=FIRST, count=COUNT,
                                     engine_config=EngineConfig(remote=url, remote_password=PASSWORD))
    assert verdict.failures == 0 and verdict.tokens > 0
    assert counts["remote blocks placed (fetched, verified)"] > 0
    assert counts["remote values refused"] == 0
    alone, _, _ = run.run(first=FIRST, count=COUNT)
    assert counts["prefill tokens computed"] < alone["prefill tokens computed"]
