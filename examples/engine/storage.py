"""Where the engine's KV bytes are read and written: the memory behind kvblock's pool views.

A pool is seen as a flat array of slabs, one slab [kv heads, tokens per block, head size] per
offset-table entry (pools.py). Three ways to reach it, one class each, the same two operations:
`write(entries, slots, values)` stores one token's heads at slot `slots[i]` of slab `entries[i]`,
and `gather(entries)` returns those slabs as a numpy array [n, heads, tokens per block, head size].

- `HostSlabs`: the host backend's pool, a numpy array (the CPU path; numpy only).
- `TorchSlabs`: the CUDA backend's GPU pool as a torch tensor (`torch.from_dlpack` of the view);
  kvblock's copies run on torch's current stream, which the engine gives it at creation, so torch's
  reads and writes are ordered after them without a synchronization.
- `DriverSlabs`: the CUDA backend's GPU pool reached through the CUDA driver's synchronous copies at
  the addresses the DLPack view describes (no torch): what runs on the simulated driver in the
  test suite, and on any GPU without torch.
"""

from __future__ import annotations

import ctypes

import numpy as np


class HostSlabs:
    def __init__(self, view: np.ndarray):
        if view.dtype == np.uint8:  # a model pool's view is bytes: the engine keeps float32
            view = view.view(np.float32)
        self.slabs = view.reshape(-1, *view.shape[3:])

    def __len__(self) -> int:
        return len(self.slabs)

    def write(self, entries: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:
        self.slabs[entries, :, slots, :] = values

    def gather(self, entries: np.ndarray) -> np.ndarray:
        return self.slabs[entries]


class TorchSlabs:
    def __init__(self, view):
        import torch

        self.torch = torch
        tensor = torch.from_dlpack(view)  # the GPU pool itself, not a copy
        if tensor.dtype == torch.uint8:  # a model pool's view is bytes: the engine keeps float32
            tensor = tensor.view(torch.float32)
        self.slabs = tensor.reshape(-1, *tensor.shape[3:])

    def __len__(self) -> int:
        return self.slabs.shape[0]

    def write(self, entries: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:
        dev = self.slabs.device
        e = self.torch.as_tensor(entries, device=dev)
        s = self.torch.as_tensor(slots, device=dev)
        self.slabs[e, :, s, :] = self.torch.as_tensor(values, device=dev)

    def gather(self, entries: np.ndarray) -> np.ndarray:
        e = self.torch.as_tensor(entries, device=self.slabs.device)
        return self.slabs[e].cpu().numpy()  # .cpu() waits for the stream


# ---- the DLPack view read without a framework ------------------------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor)))]

KDL_CUDA = 2  # DLPack's device type of CUDA memory


def dlpack_info(view) -> dict:
    """Address, device, shape, strides (None = C-contiguous) and element type of a DLPack-exporting
    object, read from the capsule of `view.__dlpack__()` (which is then released)."""
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    capsule = view.__dlpack__()
    managed = ctypes.cast(api.PyCapsule_GetPointer(capsule, b"dltensor"),
                          ctypes.POINTER(_DLManagedTensor)).contents
    t = managed.dl_tensor
    info = dict(address=t.data + t.byte_offset, device_type=t.device.device_type,
                device_id=t.device.device_id, shape=tuple(t.shape[i] for i in range(t.ndim)),
                strides=None if not t.strides else tuple(t.strides[i] for i in range(t.ndim)),
                dtype=(t.dtype.code, t.dtype.bits, t.dtype.lanes))
    del capsule  # unconsumed: its destructor calls the deleter, which releases the view's owner
    return info


class DriverSlabs:
    """A GPU pool reached with cuMemcpyHtoD / cuMemcpyDtoH (synchronous copies, ordered after
    kvblock's copies on the legacy default stream, which the engine gives kvblock)."""

    def __init__(self, view, cuda: ctypes.CDLL):
        info = dlpack_info(view)
        assert info["device_type"] == KDL_CUDA, f"not a CUDA tensor: {info}"
        contiguous = tuple(int(np.prod(info["shape"][i + 1:])) for i in range(len(info["shape"])))
        assert info["strides"] in (None, contiguous), f"not C-contiguous: {info}"
        blocks, layers, two, heads, tpb, head = info["shape"]
        if info["dtype"] == (1, 8, 1):  # a model pool's view is bytes: the engine keeps float32
            head //= 4
        else:
            assert info["dtype"] == (2, 32, 1), "the engine keeps float32 KV"
        self.view = view  # keeps the manager, and so the pool, alive
        self.cu, self.base = cuda, info["address"]
        self.heads, self.tpb, self.head = heads, tpb, head
        self.count = blocks * layers * two
        self.slab_bytes = heads * tpb * head * 4

    def __len__(self) -> int:
        return self.count

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed with CUresult {code}")

    def write(self, entries: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:
        row = self.head * 4
        for e, s, v in zip(entries, slots, np.ascontiguousarray(values, dtype=np.float32)):
            for h in range(self.heads):
                address = self.base + int(e) * self.slab_bytes + (h * self.tpb + int(s)) * row
                self._check(self.cu.cuMemcpyHtoD_v2(ctypes.c_uint64(address), v[h].ctypes.data,
                                                    ctypes.c_size_t(row)), "cuMemcpyHtoD")

    def gather(self, entries: np.ndarray) -> np.ndarray:
        out = np.empty((len(entries), self.heads, self.tpb, self.head), dtype=np.float32)
        for i, e in enumerate(entries):
            address = self.base + int(e) * self.slab_bytes
            self._check(self.cu.cuMemcpyDtoH_v2(out[i].ctypes.data, ctypes.c_uint64(address),
                                                ctypes.c_size_t(self.slab_bytes)), "cuMemcpyDtoH")
        return out


class Driver:
    """The CUDA driver library for `DriverSlabs`, with device 0's primary context (the one kvblock
    uses) current on this thread. `KVB_SIM_CUDA_LIBRARY` names the simulated driver, loaded first
    and globally so kvblock's loader finds it under libcuda's name."""

    def __init__(self, device: int = 0):
        import os

        path = os.environ.get("KVB_SIM_CUDA_LIBRARY") or "libcuda.so.1"
        self.cu = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        # Pointers are 64-bit: without argtypes ctypes would pass them as C ints.
        self.cu.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        self.cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self._call("cuInit", 0)
        self.dev = ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(self.dev), device)
        ctx = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.dev)
        self._call("cuCtxSetCurrent", ctx)

    def _call(self, name: str, *args) -> None:
        code = getattr(self.cu, name)(*args)
        if code != 0:
            raise RuntimeError(f"{name} failed with CUresult {code}")

    def close(self) -> None:
        self._call("cuCtxSetCurrent", None)
        self._call("cuDevicePrimaryCtxRelease_v2", self.dev)
