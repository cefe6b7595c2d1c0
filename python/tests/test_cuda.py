"""The CUDA backend from Python: configuration, errors without a GPU, and (with a GPU and torch)
bytes moved between pools the engine owns as torch tensors, ordered with a torch stream."""

from __future__ import annotations

import pytest

import kvblock
from conftest import TPB, make_manager, prompt


def cuda_manager(**fields) -> kvblock.KVCacheManager:
    window = kvblock.WindowConfig(64, 4, 8, num_layers=2, num_kv_heads=2, size_per_head=32)
    config = kvblock.ManagerConfig(
        [window], max_sequence_length=64, tokens_per_block=TPB, bytes_per_element=2,
        copy_backend=kvblock.CopyBackend.CUDA, **fields)
    return kvblock.KVCacheManager(config)


def gpu_available() -> bool:
    try:
        cuda_manager().close()
        return True
    except kvblock.UnsupportedError:
        return False


def test_cuda_fields_round_trip():
    c = kvblock.ManagerConfig(copy_backend=kvblock.CopyBackend.CUDA, cuda_device=1, cuda_stream=0x1234,
                              cuda_transfer_mode=kvblock.CudaTransferMode.COPY_STREAM,
                              cuda_allocate_pools=False)
    assert (c.copy_backend, c.cuda_device, c.cuda_stream, c.cuda_transfer_mode, c.cuda_allocate_pools) == (
        kvblock.CopyBackend.CUDA, 1, 0x1234, kvblock.CudaTransferMode.COPY_STREAM, False)
    assert "cuda_stream=4660" in repr(c)
    assert kvblock.ManagerConfig().cuda_allocate_pools is True


def test_without_a_gpu_a_cuda_manager_is_unsupported():
    if gpu_available():
        pytest.skip("a GPU is usable here")
    with pytest.raises(kvblock.UnsupportedError, match="CUDA|NVRTC"):
        cuda_manager()


def test_host_backend_refuses_streams_and_registered_pools():
    with make_manager(primary=4, secondary=4, copy_backend=kvblock.CopyBackend.HOST) as m:
        with pytest.raises(kvblock.UnsupportedError):
            m.set_stream(0)
        with pytest.raises(kvblock.UnsupportedError):
            m.register_pool(256, kvblock.CacheLevel.PRIMARY, 0x1000, 64)
        m.sync_transfers()  # host copies are done when the call returns
        assert m.copy_launches == 0


@pytest.mark.parametrize("mode", [kvblock.CudaTransferMode.ENGINE_STREAM, kvblock.CudaTransferMode.COPY_STREAM])
def test_onboarded_bytes_in_torch_pools(mode):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not gpu_available():
        pytest.skip("no usable CUDA GPU")
    stream = torch.cuda.Stream()
    row_bytes = 2 * 2 * 2 * TPB * 32 * 2
    primary = torch.zeros(4 * row_bytes, dtype=torch.uint8, device="cuda")
    secondary = torch.zeros(8 * row_bytes, dtype=torch.uint8, pin_memory=True)
    with cuda_manager(cuda_stream=stream.cuda_stream, cuda_transfer_mode=mode, cuda_allocate_pools=False) as m:
        m.register_pool(64, kvblock.CacheLevel.PRIMARY, primary.data_ptr(), primary.numel())
        m.register_pool(64, kvblock.CacheLevel.SECONDARY, secondary.data_ptr(), secondary.numel())
        tokens = prompt(13)
        m.add_sequence(1, tokens)
        with torch.cuda.stream(stream):  # the engine computes the prompt's KV
            for i, block in enumerate(m.get_cache_block_ids(1, 64)):
                row = m.get_block_info(64, block).memory_index
                primary[row * row_bytes:(row + 1) * row_bytes].fill_(i + 1)
        m.store_context_blocks(1, 13)
        m.remove_sequence(1)
        m.add_sequence(2, prompt(16, start=1000))  # evicts: the cached blocks go to the host tier
        m.remove_sequence(2, store_for_reuse=False)
        admission = m.add_sequence(3, tokens)
        m.sync_transfers()
        assert admission.prepopulated_prompt_len == 12
        with torch.cuda.stream(stream):
            rows = [m.get_block_info(64, b).memory_index for b in m.get_cache_block_ids(3, 64)[:3]]
            got = [primary[r * row_bytes:(r + 1) * row_bytes].clone() for r in rows]
        stream.synchronize()
        for i, g in enumerate(got):
            assert bool((g == i + 1).all()), f"block {i} lost its bytes"
