"""The dtypes of tensors: their names, what a dtype argument may be, and how binary ops promote."""
from __future__ import annotations

import numpy as np

from portkit import runtime
from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.errors import UnsupportedDType

bool_, int8, int16, int32, int64 = (dtypes.bool_, dtypes.int8, dtypes.int16, dtypes.int32,
                                    dtypes.int64)
uint8, uint16, uint32, uint64 = dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64
float16, bfloat16, float32, float64 = (dtypes.float16, dtypes.bfloat16, dtypes.float32,
                                       dtypes.float64)
default_float = float32

Scalar = int | float | bool
# A dtype argument: a portkit DType, a numpy dtype or scalar type (np.float32), or a name
# ("float32", "bfloat16").
DTypeLike = DType | np.dtype | type[np.generic] | str


def to_dtype(dtype: DTypeLike | None) -> DType | None:
    """The DType a dtype argument names (None stays None: the caller picks a default)."""
    if dtype is None or isinstance(dtype, DType):
        return dtype
    return dtypes.by_name(dtype) if isinstance(dtype, str) else dtypes.from_numpy(dtype)


def float_of(dtype: DType) -> DType:
    """The dtype that float math on `dtype` computes in: itself if a float, else default_float."""
    return dtype if dtype.is_float else default_float


def scalar_dtype(value: Scalar) -> DType:
    """The dtype a Python number takes in a tensor: bool, int32 or default_float."""
    if isinstance(value, bool):
        return bool_
    return int32 if isinstance(value, int) else default_float


def promote(a: DType, b: DType) -> DType:
    """The dtype of a binary op between tensors of dtypes a and b (PyTorch's rules)."""
    if a is b or a == b:
        return a
    if a.is_float or b.is_float:
        floats = [d for d in (a, b) if d.is_float]
        if len(floats) == 2 and {a, b} == {float16, bfloat16}:
            return float32
        return max(floats, key=lambda d: d.itemsize)
    if a == bool_ or b == bool_:
        return b if a == bool_ else a
    if a.kind == b.kind:
        return max((a, b), key=lambda d: d.itemsize)
    signed, unsigned = (a, b) if a.kind == "int" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return {1: int16, 2: int32, 4: int64}.get(unsigned.itemsize, int64)


def _category(dtype: DType) -> int:
    return 0 if dtype == bool_ else 2 if dtype.is_float else 1


def promote_tensors(a, b) -> DType:
    """The dtype of a binary op between tensors a and b. As torch: a 0-d tensor beside one with
    dimensions sets the dtype only if its category (bool < integer < float) is higher, so
    `half_tensor * torch.tensor(2.0)` stays float16 and `int_tensor + tensor(0.5)` is float32."""
    a_dtype, b_dtype = a.lazy.dtype, b.lazy.dtype
    if a_dtype is b_dtype:
        return a_dtype
    if (not a.lazy.shape) == (not b.lazy.shape):
        return promote(a_dtype, b_dtype)
    dims, zero = (a_dtype, b_dtype) if not b.lazy.shape else (b_dtype, a_dtype)
    return zero if _category(zero) > _category(dims) else dims


def check_dtype(dtype: DType, device: str) -> DType:
    """dtype, if the device has it; else UnsupportedDType naming a dtype it has."""
    if dtype in runtime.get(device).capabilities.dtypes:
        return dtype
    instead = "float32" if dtype.is_float else "int32"
    raise UnsupportedDType(f"device {device!r} has no {dtype.name}; use "
                           f"dtype=portkit.{instead} (or .cast(portkit.{instead})), or a device "
                           f"with {dtype.name}")
