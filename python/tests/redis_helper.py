"""A real redis-server for the remote tier's tests: a free loopback port, a password, a temporary
directory; stopped by the context manager. `INSTALLED` is false when Debian's redis-server /
redis-cli are missing (scripts/setup.sh installs them): the tests that need it then fail."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time

PASSWORD = "kvblock-py-test-secret"
# A real Redis is part of the test environment (scripts/setup.sh installs Debian's): its absence
# fails the tests that need it instead of skipping them.
INSTALLED = shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None
MISSING = "redis-server / redis-cli not found: run scripts/setup.sh --tests"


@contextlib.contextmanager
def redis_server():
    """Yields the server's redis:// URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--requirepass",
                                 PASSWORD, "--save", "", "--appendonly", "no", "--dir", d],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while subprocess.run(["redis-cli", "-p", str(port), "-a", PASSWORD, "--no-auth-warning", "PING"],
                                 capture_output=True, text=True).stdout.strip() != "PONG":
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}"
        finally:
            proc.kill()
            proc.wait()
