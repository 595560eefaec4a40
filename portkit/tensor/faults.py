"""Device-side index checks: the flag a gather kernel sets for an index out of range, and the
check at the next read-back that raises it, as torch's device asserts do.

Each device has one int32 flag buffer, zero while nothing is wrong. A GATHER kernel (see
portkit/codegen/lower.py) stores its op's nonzero code into it, with a plain store, where an
index falls outside its axis, and clamps that load into the axis, so it never reads outside its
buffer. A code names the op, the dim and its size; `code` hands out one per distinct message,
so equal ops compile to equal kernels. Tensor's read-backs (.numpy(), .item(), .tolist()) call
`check` after running their graph: a set flag is cleared and raised as IndexOutOfRange. Inside
portkit.jit nothing is read back: a replayed kernel sets the flag, and the first read-back
after the replay raises.
"""
from __future__ import annotations

import threading

import numpy as np

from portkit import graph, runtime
from portkit.abi import dtypes
from portkit.abi.errors import PortkitError
from portkit.graph import Lazy


class IndexOutOfRange(PortkitError, IndexError, RuntimeError):
    """An index computed on the device fell outside its dim (torch raises IndexError for
    indexing, index_select and embedding, RuntimeError for gather: this is both)."""


_lock = threading.Lock()
_flags: dict[str, Lazy] = {}        # device -> its flag, a realized int32[1]
_codes: dict[str, int] = {}         # message -> code (1, 2, ...)
_messages: list[str] = []           # code - 1 -> message
_ZERO = np.zeros(1, np.int32)


def flag(device: str) -> Lazy:
    """The fault flag of `device` as a graph node (made, zeroed, on first use)."""
    found = _flags.get(device)
    if found is None:
        with _lock:
            found = _flags.get(device)
            if found is None:
                # not schedule.upload: portkit.jit would take it for an upload of the function
                buffer = runtime.get(device).alloc(dtypes.int32, 1).copyin(_ZERO)
                found = _flags[device] = graph.load(buffer, dtypes.int32, (1,), device)
    return found


def code(op: str, dim: int, size: int, wrap: bool) -> int:
    """The code a kernel of `op` stores for an index outside `dim` of `size`."""
    valid = f"-{size} to {size - 1}" if wrap else f"0 to {size - 1}"
    message = (f"{op}: an index computed on the device is out of range for dimension {dim} "
               f"with size {size} (valid indices: {valid}); check the index tensor's values")
    found = _codes.get(message)
    if found is None:
        with _lock:
            found = _codes.setdefault(message, len(_messages) + 1)
            if found == len(_messages) + 1:
                _messages.append(message)
    return found


def check(device: str) -> None:
    """Raises IndexOutOfRange if a kernel on `device` found an index out of range since the
    last check (and clears the flag)."""
    found = _flags.get(device)
    if found is None:
        return
    value = int(found.buffer.numpy((1,))[0])
    if value:
        found.buffer.copyin(_ZERO)
        raise IndexOutOfRange(_messages[value - 1] if value <= len(_messages)
                              else f"a kernel stored the unknown fault code {value}")
