"""Compiled programs and the cache that keeps the most recently used ones."""
from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from portkit.abi import dtypes
from portkit.abi.backend import Program
from portkit.abi.kernel import Kernel, scalar_words

_MISSING = object()


class LRU:
    """A dict that keeps its `size` most recently used entries (get and set both use one);
    safe to share between threads. A look-up hashes its key once and compares it once."""

    def __init__(self, size: int):
        self.size = size
        self._guard = threading.RLock()
        # hash(key) -> (key, value), least recently used first. Graph keys are long nested
        # tuples: stored under their hash, a look-up hashes one once (in C, where a key object
        # with Python __hash__ and __eq__ took 0.24 us more), and moving the entry to the end
        # hashes an int. Two keys of one hash keep the later; the other is then a miss.
        self._entries: OrderedDict[int, tuple[Any, Any]] = OrderedDict()

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of `key` (now the most recently used), or `default`."""
        digest = hash(key)
        with self._guard:
            found = self._entries.get(digest)
            if found is not None and found[0] == key:
                self._entries.move_to_end(digest)
                return found[1]
            return default

    def __setitem__(self, key: Any, value: Any) -> None:
        digest = hash(key)
        with self._guard:
            self._entries.pop(digest, None)     # so that it is the most recent
            self._entries[digest] = (key, value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def setdefault(self, key: Any, value: Any) -> Any:
        """The value of `key` if there is one, else `value`, stored; either is now the most
        recently used."""
        with self._guard:
            found = self.get(key, _MISSING)
            if found is not _MISSING:
                return found
            self[key] = value
            return value

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter([key for key, _ in self._entries.values()])

    def clear(self) -> None:
        """Forgets every entry."""
        with self._guard:
            self._entries.clear()


@dataclass
class Compiled:
    """A kernel ready to launch: the kernel as run (after decomposition), its source, its
    program, and the seconds rendering and compiling took."""

    kernel: Kernel
    source: str
    program: Program
    seconds: float = field(default=0.0, compare=False)
    shown: bool = field(default=False, compare=False)   # PORTKIT_DEBUG>=3 printed its JSON
    # PORTKIT_CHECK=1: the bounds-checked build (codegen.check.Checked), its Compiled and its
    # fault buffer
    checked: tuple | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        # What every launch checks and packs, read from the kernel once rather than per launch.
        kernel = self.kernel
        self.buffer_dtypes = tuple(p.value_dtype for p in kernel.params)
        self.var_dtypes = kernel.var_dtypes
        self.words_are_values = all(d == dtypes.int32 for d in self.var_dtypes)
        # scalar_words' packing, with its formats built once (VAR dtypes' numpy codes are
        # struct's): about 0.2 us a launch instead of 1
        self.packing = (struct.Struct("<" + "".join(d.np.char for d in self.var_dtypes)),
                        struct.Struct(f"<{len(self.var_dtypes)}i"))

    def words(self, scalars: Sequence) -> list:
        """The scalar arguments' values as the 32-bit words the program takes."""
        if self.words_are_values:
            return list(scalars)
        values, words = self.packing
        try:
            return list(words.unpack(values.pack(*scalars)))
        except (struct.error, OverflowError):     # out of range: scalar_words wraps it
            return scalar_words(self.var_dtypes, tuple(scalars))
