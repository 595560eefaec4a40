"""numpy and DLPack interop, and repr with values.

`np.asarray(t)` and `t + ndarray` work through `__array__` (numpy defers its operators to
Tensor). DLPack: a tensor on a host-memory backend (cpu, interpreter: buffers are host arrays)
is exported without a copy, so `torch.from_dlpack(t)` shares its memory; on a device backend
the export is a host copy (the contract: `__dlpack_device__` is always the CPU, and a consumer
that needs the device's memory should use the device's own API).

`from_dlpack(x)` (in core.py, since it makes a Tensor) imports without a copy onto a
host-memory backend when x is C-contiguous host memory: the Tensor is a realized buffer over x's
memory (its LOAD leaf). Laziness then means: each graph that reads it reads x's memory when it
is realized, so a write through x before that is seen, and a result once realized is its own
buffer and does not change. portkit never writes into it. Otherwise (a device backend, a strided
or empty x) the values are copied at import.

bfloat16 crosses DLPack both ways although numpy, which makes and reads the capsules, has no
bfloat16: the int16 view's capsule is relabelled kDLBfloat on export, and a kDLBfloat capsule
is read as int16 and viewed as bfloat16 on import (`_relabelled`).
"""
from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

_DLPACK_CPU = 1          # DLDeviceType kDLCPU
_DL_INT, _DL_BFLOAT = 0, 4   # DLDataTypeCode


class _DLTensorHead(ctypes.Structure):
    """The start of a DLPack DLTensor, up to its dtype (DLManagedTensor begins with one)."""
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


def _relabelled(capsule: Any, code: int) -> _DLTensorHead | None:
    """The head of an unversioned "dltensor" capsule's tensor if its dtype is 16-bit with
    type code `code`, else None; writing `.code` relabels the capsule before it is consumed."""
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    head = _DLTensorHead.from_address(get(capsule, b"dltensor"))
    return head if (head.code, head.bits, head.lanes) == (code, 16, 1) else None


class _Capsule:
    """A DLPack producer handing over one capsule made already."""

    def __init__(self, capsule: Any, device: tuple[int, int]):
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **_: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


def import_dlpack(source: Any) -> np.ndarray:
    """np.from_dlpack(source), and a bfloat16 source too (as an int16 capsule, viewed back)."""
    try:
        return np.from_dlpack(source)
    except (RuntimeError, BufferError, TypeError):
        capsule = source.__dlpack__()          # unversioned: the layout _DLTensorHead reads
        head = _relabelled(capsule, _DL_BFLOAT)
        if head is None:
            raise
        head.code = _DL_INT
        bits = np.from_dlpack(_Capsule(capsule, source.__dlpack_device__()))
        return bits.view(ml_dtypes.bfloat16)


class _HostView:
    """Holds the Buffer that a shared array reads, so the pool cannot reuse its memory while
    a consumer (numpy, torch) still holds the array."""

    def __init__(self, buffer: Any, array: np.ndarray):
        self.buffer, self.array = buffer, array
        self.__array_interface__ = array.__array_interface__


class InteropOps:
    """Tensor's __array__, __dlpack__, __dlpack_device__ and __repr__."""

    __slots__ = ()
    __array_ufunc__ = None      # ndarray + Tensor: numpy returns NotImplemented, Tensor answers

    def __array__(self: Tensor, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The values as a numpy array (np.asarray(t), np.array(t))."""
        shared = self._host_array()
        array = shared if shared is not None and copy is not True else self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def _host_array(self: Tensor) -> np.ndarray | None:
        """The realized values as an array sharing this tensor's host memory, or None where
        the buffer is not host memory (a device backend) or not laid out as this shape."""
        self.realize()
        buffer = self.lazy.buffer
        handle = getattr(buffer, "handle", None)
        if not isinstance(handle, np.ndarray) or self.numel() == 0 or not self.lazy.realized:
            return None
        flat = handle[:self.numel() * self.dtype.itemsize].view(self.dtype.np)
        # through __array_interface__ a bfloat16 array comes back as void ("|V2"): view it
        return np.asarray(_HostView(buffer, flat.reshape(self.shape))).view(flat.dtype)

    def __dlpack__(self: Tensor, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        """A DLPack capsule: this tensor's memory on a host-memory backend, else a host copy."""
        shared = self._host_array() if copy is not True else None
        array = shared if shared is not None else self.numpy()
        if copy is False and shared is None:
            raise BufferError(f"a tensor on {self.device!r} cannot be shared without a copy; "
                              "pass copy=None or True")
        if self.dtype.name != "bfloat16":
            return array.__dlpack__()
        capsule = array.view(np.int16).__dlpack__()
        head = _relabelled(capsule, _DL_INT)
        assert head is not None
        head.code = _DL_BFLOAT
        return capsule

    def __dlpack_device__(self: Tensor) -> tuple[int, int]:
        """(kDLCPU, 0): exports are host memory on every backend (see the module docstring)."""
        return (_DLPACK_CPU, 0)

    def __repr__(self: Tensor) -> str:
        """The values, as PyTorch prints them, with dtype and device (runs the graph)."""
        grad = ", requires_grad=True" if self.requires_grad else ""
        array = self.numpy()        # numpy prints bfloat16 [1, 2.5]; torch [1.0000, 2.5000]
        array = array.astype(np.float32) if array.dtype == ml_dtypes.bfloat16 else array
        values = np.array2string(array, separator=", ", prefix="Tensor(",
                                 threshold=1000, edgeitems=3)
        return f"Tensor({values}, dtype={self.dtype.name}, device={self.device!r}{grad})"
