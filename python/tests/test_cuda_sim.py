"""The CUDA backend from Python on the simulated CUDA driver (cpp_tests/sim_cuda): kvblock
allocates its pools in (simulated) GPU memory and pinned host memory, the engine writes and reads
them with driver copies, and bytes survive an offload to the host tier and the onboard back, in
both transfer modes. Runs where KVB_SIM_CUDA_LIBRARY names the simulator (scripts/test.sh runs this
file that way); on a real GPU the torch tests of test_cuda.py cover the same path."""

from __future__ import annotations

import ctypes

import pytest

import kvblock
from conftest import SIM_CUDA, TPB, prompt

pytestmark = pytest.mark.skipif(
    SIM_CUDA is None, reason="KVB_SIM_CUDA_LIBRARY is not set (scripts/test.sh sets it)")

WINDOW = 64
ROW_BYTES = 2 * 2 * 2 * TPB * 32 * 2  # layers × K|V × heads × tokens × head size × 2 bytes


def check(code: int, call: str) -> None:
    assert code == 0, f"{call} returned CUresult {code}"


@pytest.fixture
def context():
    """Device 0's primary context, current on this thread (the engine's own driver calls)."""
    cu = SIM_CUDA
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int(0)
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    yield cu
    check(cu.cuCtxSetCurrent(None), "cuCtxSetCurrent")
    check(cu.cuDevicePrimaryCtxRelease_v2(dev), "cuDevicePrimaryCtxRelease")


def write_row(cu, address: int, value: int) -> None:
    data = (ctypes.c_uint8 * ROW_BYTES)(*([value] * ROW_BYTES))
    check(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(address), data, ctypes.c_size_t(ROW_BYTES)),
          "cuMemcpyHtoD")


def read_row(cu, address: int) -> bytes:
    data = (ctypes.c_uint8 * ROW_BYTES)()
    check(cu.cuMemcpyDtoH_v2(data, ctypes.c_uint64(address), ctypes.c_size_t(ROW_BYTES)),
          "cuMemcpyDtoH")
    return bytes(data)


def sim_config(mode=kvblock.CudaTransferMode.ENGINE_STREAM) -> kvblock.ManagerConfig:
    window = kvblock.WindowConfig(WINDOW, 4, 8, num_layers=2, num_kv_heads=2, size_per_head=32)
    return kvblock.ManagerConfig(
        [window], max_sequence_length=WINDOW, tokens_per_block=TPB, bytes_per_element=2,
        copy_backend=kvblock.CopyBackend.CUDA, cuda_transfer_mode=mode)


def kernel_available() -> bool:
    """False only where the run takes both the embedded CUBINs and NVRTC away."""
    import os

    return not (os.environ.get("KVB_SIM_EXPECT_NVRTC") == "0"
                and os.environ.get("KVB_SIM_CUDA_ARCH") == "75")


@pytest.mark.parametrize("mode", [kvblock.CudaTransferMode.ENGINE_STREAM,
                                  kvblock.CudaTransferMode.COPY_STREAM])
def test_offloaded_and_onboarded_bytes_on_the_simulated_driver(context, mode):
    if not kernel_available():
        pytest.skip("no kernel for sm_75 without NVRTC: see the test below")
    cu = context
    with kvblock.KVCacheManager(sim_config(mode)) as m:
        base, row_bytes = m.get_pool_pointer(WINDOW, kvblock.CacheLevel.PRIMARY)
        assert row_bytes == ROW_BYTES
        tokens = prompt(13)
        m.add_sequence(1, tokens)
        m.sync_transfers()  # the engine computes into the blocks after kvblock's copies
        for i, block in enumerate(m.get_cache_block_ids(1, WINDOW)):
            write_row(cu, base + m.get_block_info(WINDOW, block).memory_index * ROW_BYTES, i + 1)
        m.store_context_blocks(1, 13)
        m.remove_sequence(1)
        m.add_sequence(2, prompt(16, start=1000))  # evicts: the cached blocks go to the host tier
        m.remove_sequence(2, store_for_reuse=False)
        assert m.get_kv_cache_stats().offloaded_blocks == 3
        admission = m.add_sequence(3, tokens)
        m.sync_transfers()
        assert admission.prepopulated_prompt_len == 12
        assert m.copy_launches > 0
        for i, block in enumerate(m.get_cache_block_ids(3, WINDOW)[:3]):
            row = m.get_block_info(WINDOW, block).memory_index
            assert read_row(cu, base + row * ROW_BYTES) == bytes([i + 1]) * ROW_BYTES, \
                f"block {i} lost its bytes"


def test_the_gpu_pool_view_is_a_dlpack_tensor_over_the_pool(context):
    """pool_view of a GPU pool: an object with __dlpack__ / __dlpack_device__ on cuda:0, shaped
    like the host view, at the pool's device address; rows written through it by driver copies are
    the rows kvblock offloads."""
    if not kernel_available():
        pytest.skip("no kernel for sm_75 without NVRTC")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "engine"))
    from storage import KDL_CUDA, dlpack_info

    cu = context
    with kvblock.KVCacheManager(sim_config()) as m:
        view = m.pool_view(WINDOW)
        assert view.__dlpack_device__() == (KDL_CUDA, 0)
        info = dlpack_info(view)
        base, _ = m.get_pool_pointer(WINDOW, kvblock.CacheLevel.PRIMARY)
        assert info["address"] == base
        assert info["shape"] == (4, 2, 2, 2, TPB, 32)
        assert info["dtype"] == (2, 16, 1)  # float16 for bytes_per_element 2
        assert m.live_pool_views == 1
        host = m.pool_view(WINDOW, kvblock.CacheLevel.SECONDARY)  # pinned host memory: numpy
        assert host.shape == (8, 2, 2, 2, TPB, 32)
        m.add_sequence(1, prompt(8))
        rows = [m.get_block_info(WINDOW, b).memory_index for b in m.get_cache_block_ids(1, WINDOW)]
        m.sync_transfers()
        for i, row in enumerate(rows):
            write_row(cu, info["address"] + row * ROW_BYTES, 0x40 + i)
        m.store_context_blocks(1, 8)
        m.remove_sequence(1)
        m.add_sequence(2, prompt(16, start=1000))  # evicts both blocks to the host tier
        assert m.get_kv_cache_stats().offloaded_blocks == 2
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")  # the offload ran on the engine's stream
        for i in range(2):
            assert (host.view("uint8") == 0x40 + i).all(axis=tuple(range(1, 6))).any(), \
                f"row {i} written through the DLPack view did not reach the host tier"
        m.remove_sequence(2, store_for_reuse=False)
        del view, host


def test_the_loader_path_holds_nvrtc_only_where_the_run_says_so():
    """scripts/test.sh runs this file three times: with NVRTC (the device's CUBIN embedded), with
    no NVRTC on the loader path (KVB_SIM_EXPECT_NVRTC=0: the embedded CUBIN must suffice), and on
    an architecture no embedded CUBIN runs on (KVB_SIM_CUDA_ARCH=75: NVRTC compiles it)."""
    import os

    expect = os.environ.get("KVB_SIM_EXPECT_NVRTC", "1") == "1"
    try:
        ctypes.CDLL("libnvrtc.so.13")
        found = True
    except OSError:
        found = False
    assert found == expect, f"NVRTC {'missing' if expect else 'present'} on the loader path"


def test_an_architecture_without_cubin_or_nvrtc_is_a_clear_error():
    if kernel_available():
        pytest.skip("runs with KVB_SIM_EXPECT_NVRTC=0 KVB_SIM_CUDA_ARCH=75")
    with pytest.raises(kvblock.UnsupportedError, match="no embedded CUBIN runs on sm_75"):
        kvblock.KVCacheManager(sim_config())
