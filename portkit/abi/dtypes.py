"""The ABI's element types: a fixed list, each with its numpy equivalent.

bfloat16 has no numpy type of its own; it comes from ml_dtypes, the library JAX uses for it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from portkit.abi.errors import UnsupportedDType


@dataclass(frozen=True, eq=False)
class DType:
    """An element type: its ABI name, size in bytes and kind ("bool", "int", "uint", "float")."""

    name: str
    itemsize: int
    kind: str
    _hash: int = field(init=False, repr=False, compare=False)

    # Equal fields make equal dtypes, as a dataclass's; spelled out because `dtype in
    # caps.dtypes` and graph keys hash and compare dtypes on every op, and the generated
    # methods build field tuples each call.
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.itemsize, self.kind)))

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, DType):
            return NotImplemented
        return (self.name, self.itemsize, self.kind) == (other.name, other.itemsize, other.kind)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        # rebuilt from the fields: a str hash differs between processes
        return DType, (self.name, self.itemsize, self.kind)

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    @property
    def bits(self) -> int:
        return self.itemsize * 8

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        """True for signed and unsigned integers (not bool)."""
        return self.kind in ("int", "uint")

    @property
    def np(self) -> np.dtype:
        """The numpy dtype holding values of this type."""
        return _NUMPY[self.name]

    @property
    def min(self) -> int | float:
        return self.np.type(0) if self.kind == "bool" else _info(self).min

    @property
    def max(self) -> int | float:
        return self.np.type(1) if self.kind == "bool" else _info(self).max


@functools.cache          # a kernel's validation reads the int limits at every constant
def _info(dtype: DType):
    return ml_dtypes.finfo(dtype.np) if dtype.is_float else np.iinfo(dtype.np)


bool_ = DType("bool", 1, "bool")
int8, int16, int32, int64 = (DType(f"int{b}", b // 8, "int") for b in (8, 16, 32, 64))
uint8, uint16, uint32, uint64 = (DType(f"uint{b}", b // 8, "uint") for b in (8, 16, 32, 64))
float16 = DType("float16", 2, "float")
bfloat16 = DType("bfloat16", 2, "float")
float32 = DType("float32", 4, "float")
float64 = DType("float64", 8, "float")

ALL: tuple[DType, ...] = (
    bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64,
    float16, bfloat16, float32, float64,
)
INTS = tuple(d for d in ALL if d.is_int)
FLOATS = tuple(d for d in ALL if d.is_float)
NUMERIC = INTS + FLOATS

_NUMPY = {d.name: np.dtype(ml_dtypes.bfloat16 if d is bfloat16 else d.name) for d in ALL}
_BY_NAME = {d.name: d for d in ALL}


def by_name(name: str) -> DType:
    """The DType called `name`; raises UnsupportedDType listing the valid names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnsupportedDType(
            f"unknown dtype {name!r}; the ABI has: {', '.join(_BY_NAME)}") from None


def from_numpy(dtype: np.dtype | type) -> DType:
    """The DType of a numpy dtype; raises UnsupportedDType for types outside the ABI."""
    dtype = np.dtype(dtype)
    name = "bfloat16" if dtype == ml_dtypes.bfloat16 else dtype.name
    if name not in _BY_NAME:
        raise UnsupportedDType(f"numpy dtype {dtype} has no ABI equivalent; "
                               f"cast to one of: {', '.join(_BY_NAME)}")
    return _BY_NAME[name]
