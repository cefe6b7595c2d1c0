"""The shared remote tier through the Python binding, against a real redis-server started here
(free loopback port, password; failing when redis-server is not installed — scripts/setup.sh
installs it): a second manager reuses the prefix the first computed, with the bytes; a wrong
password is an InvalidConfigError at creation."""

from __future__ import annotations

import time

import numpy as np
import pytest
from redis_helper import INSTALLED, MISSING, PASSWORD, redis_server

import kvblock

TPB = 4
PRIMARY = kvblock.CacheLevel.PRIMARY



@pytest.fixture(autouse=True)
def redis_is_installed():
    assert INSTALLED, MISSING


@pytest.fixture
def redis_url():
    with redis_server() as url:
        yield url


def manager(url, password=PASSWORD):
    config = kvblock.ManagerConfig([kvblock.WindowConfig(64, primary_blocks=8, secondary_blocks=8, size_per_head=4)],
                                   max_sequence_length=64, tokens_per_block=TPB, bytes_per_element=1,
                                   copy_backend=kvblock.CopyBackend.HOST)
    config.with_remote_tier(url, "py-test-model", password)
    return kvblock.KVCacheManager(config)


def settle(m):
    deadline = time.monotonic() + 20
    while True:
        m.remote_poll()
        s = m.get_remote_stats()
        if s.writes_queued == s.lookups_in_flight == s.fetches_in_flight == 0:
            return s
        assert time.monotonic() < deadline, "remote I/O hangs"
        time.sleep(0.001)


def test_a_second_manager_reuses_the_prefix_with_its_bytes(redis_url):
    tokens = np.arange(100, 117, dtype=np.int32)
    a = manager(redis_url)
    assert a.has_remote_tier
    a.add_sequence(1, tokens)
    gpu = a.pool_view(64, PRIMARY)
    written = []
    for i, b in enumerate(a.get_cache_block_ids(1, 64)[:4]):
        row = a.get_block_info(64, b).memory_index
        gpu[row] = (np.arange(gpu[row].size, dtype=np.int64).reshape(gpu[row].shape) * 7 + i) % 251
        written.append(gpu[row].copy())
    a.store_context_blocks(1, len(tokens))
    a.remove_sequence(1, True)
    assert settle(a).writes == 4
    del gpu
    a.close()

    b = manager(redis_url)
    req = kvblock.Request(2, tokens)
    deadline = time.monotonic() + 20
    while b.remote_prefetch([req])[0].pending > 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert b.remote_blocks_pending(req) == 0
    s = b.get_remote_stats()
    assert (s.hits, s.verify_failures) == (4, 0)
    assert b.add_sequence(req).prepopulated_prompt_len == 16
    gpu = b.pool_view(64, PRIMARY)
    for i, blk in enumerate(b.get_cache_block_ids(2, 64)[:4]):
        np.testing.assert_array_equal(gpu[b.get_block_info(64, blk).memory_index], written[i])
    del gpu
    b.close()


def test_tls_settings_are_checked_at_creation():
    """The TLS fields reach the library: TLS files with a plain redis:// URL are refused; a
    rediss:// URL needs a library built with TLS (the wheel's default build has none)."""
    config = kvblock.ManagerConfig([kvblock.WindowConfig(64, primary_blocks=8, secondary_blocks=8)],
                                   max_sequence_length=64, tokens_per_block=TPB)
    config.with_remote_tier("redis://127.0.0.1:1", "m", tls_ca_file="/nonexistent/ca.crt")
    with pytest.raises(kvblock.InvalidConfigError, match="rediss://"):
        kvblock.KVCacheManager(config)
    config.with_remote_tier("rediss://127.0.0.1:1", "m")
    with pytest.raises(kvblock.InvalidConfigError, match="feature `tls`"):
        kvblock.KVCacheManager(config)


def test_a_wrong_password_fails_creation(redis_url):
    with pytest.raises(kvblock.InvalidConfigError, match="refused the credentials"):
        manager(redis_url, password="wrong")
