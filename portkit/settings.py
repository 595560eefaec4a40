"""Every PORTKIT_* environment variable, declared once: its name, how its value is read, its
default and what it does. Code reads a setting through `read(name)` (or `raw(name)` for the text
as given), never from os.environ directly; docs/settings.md is generated from `SETTINGS`
(`python -m portkit.settings`), and a test holds the page and the code together.

Values are read at each call, not cached: tests and users change them while a process runs. A
value a setting cannot read raises ValueError naming the setting and the values it accepts.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Setting:
    """One environment variable: `parse` turns its text (never empty) into its value."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    accepts: str        # the values it takes, in words (for the error and the docs)
    doc: str


def _count(name: str, positive: bool = False) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = text.strip()
        if not value.isdigit() or (positive and int(value) == 0):
            raise ValueError(f"{name}={text!r} is not a {'positive ' if positive else ''}whole "
                             "number; set it to one, e.g. 4, or unset it")
        return int(value)
    return parse


_DEBUG_WORDS = {"": 0, "0": 0, "no": 0, "false": 0, "off": 0, "yes": 1, "true": 1, "on": 1}


@functools.lru_cache(maxsize=16)
def _debug(text: str) -> int:
    value = text.strip().lower()
    if value.isdigit():
        return int(value)
    if value not in _DEBUG_WORDS:
        raise ValueError(f"PORTKIT_DEBUG={value!r} is not a level: use 0-4, or yes/no")
    return _DEBUG_WORDS[value]


_CHECK_WORDS = {**dict.fromkeys(("", "0", "no", "false", "off"), ""),
                **dict.fromkeys(("1", "yes", "true", "on", "compiled"), "compiled"),
                "interpreter": "interpreter"}


def _check(text: str) -> str:
    mode = _CHECK_WORDS.get(text.strip().lower())
    if mode is None:
        raise ValueError(f"PORTKIT_CHECK={text!r} is not a mode: use 1 (compiled), "
                         "interpreter, or 0")
    return mode


def _text(text: str) -> str:
    return text


def _seconds(text: str) -> float | None:
    value = text.strip().lower()
    if value in ("off", "no", "never"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"PORTKIT_PROGRESS={text!r} is not a number of seconds: use e.g. 3, "
                         "0 (always), or off")
    return seconds


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("PORTKIT_DEVICE", _text, "cpu", "a device name (\"cpu\", \"opencl:1\")",
            "The device a Tensor gets when none is named."),
    Setting("PORTKIT_DEBUG", _debug, 0, "0-4, or yes/no",
            "1: each realize prints its kernel count and time; 2: one line per launch (name, "
            "grid, block, time); 3: also the ABI kernel's JSON; 4: also its rendered source "
            "(3 and 4 at a kernel's first launch)."),
    Setting("PORTKIT_CHECK", _check, "", "1 (or compiled), interpreter, or 0",
            "Bounds checks on every launch: 1 runs each kernel's bounds-checked build, which "
            "skips an out-of-bounds LOAD or STORE and raises OutOfBoundsError after the "
            "launch; interpreter first runs each launch in the ABI interpreter (slow)."),
    Setting("PORTKIT_BEAM", _count("PORTKIT_BEAM"), 0, "a whole number",
            "How many LOCAL tilings the tuner times for a matmul-shaped kernel it has no "
            "stored choice for (0: no search, the heuristics decide)."),
    Setting("PORTKIT_CACHE", _text, None, "a folder",
            "The on-disk cache of compiled kernels and tuned choices (default: the user's "
            "cache folder, ~/.cache/portkit on Linux)."),
    Setting("PORTKIT_CACHE_MAX_MB", _count("PORTKIT_CACHE_MAX_MB"), 1024, "megabytes",
            "The size the on-disk cache is kept under; the least recently used entries go."),
    Setting("PORTKIT_KERNEL_CACHE", _count("PORTKIT_KERNEL_CACHE", positive=True), 1024,
            "a positive whole number",
            "How many compiled kernels (and lowered kernels, and replays) each in-memory cache "
            "keeps; the least recently used go."),
    Setting("PORTKIT_POOL_MB", _count("PORTKIT_POOL_MB"), 256, "megabytes",
            "How much freed device memory each device keeps for reuse by later buffers."),
    Setting("PORTKIT_PROFILE", _text, None, "a file path",
            "Profile the whole process: kernel launches (each waits for its kernel), compiles, "
            "realizes and read-backs, written as a Chrome/Perfetto trace to this file at exit."),
    Setting("PORTKIT_PROGRESS", _seconds, 3.0, "seconds, or off",
            "Show progress (a bar on a terminal, a line each tenth of the way otherwise) on "
            "stderr once compiling a step's kernels has taken this long; quicker compiles print "
            "nothing."),
    Setting("PORTKIT_CPU_DEVICES", _count("PORTKIT_CPU_DEVICES", positive=True), 2,
            "a positive whole number",
            "How many logical devices the cpu backend has (\"cpu\", \"cpu:1\", ...): each "
            "with its own memory, sharing the cores, so work across devices runs on one "
            "machine. Read when the backend first loads in a process."),
    Setting("PORTKIT_CC", _text, None, "a compiler command",
            "The cpu backend's C compiler command (default: clang, else gcc, else cc)."),
)}


def raw(name: str) -> str:
    """The text of setting `name` as set in the environment ("" when unset)."""
    return os.environ.get(SETTINGS[name].name, "")


def read(name: str) -> Any:
    """Setting `name`'s value: its text parsed, or its default when unset or empty."""
    setting = SETTINGS[name]
    text = os.environ.get(name, "")
    return setting.parse(text) if text else setting.default


def megabytes(name: str) -> int:
    """A setting in megabytes, as bytes."""
    return read(name) << 20


class Launch(NamedTuple):
    """What every launch of a realize or a replay obeys, read once for all of them."""

    debug: int      # PORTKIT_DEBUG's level
    check: str      # PORTKIT_CHECK's mode


_QUIET = Launch(0, "")
# Whether either is set is asked of the dict behind os.environ (CPython's, by encoded name; what
# os.environ[...] = ... and monkeypatch.setenv update) in 50 ns, where `in os.environ` takes
# 2 us: a realize asks at every call. Elsewhere os.environ itself answers.
_ENVIRON, _KEY = ((os.environ._data, os.environ.encodekey) if hasattr(os.environ, "_data")
                  else (os.environ, str))
_DEBUG, _CHECK = _KEY("PORTKIT_DEBUG"), _KEY("PORTKIT_CHECK")


def launch() -> Launch:
    """PORTKIT_DEBUG and PORTKIT_CHECK now (ValueError for a value neither accepts)."""
    if _DEBUG not in _ENVIRON and _CHECK not in _ENVIRON:
        return _QUIET
    return Launch(read("PORTKIT_DEBUG"), read("PORTKIT_CHECK"))


def markdown() -> str:
    """The settings table as the Markdown page docs/settings.md."""
    rows = [f"| `{s.name}` | {s.accepts} | {'unset' if s.default in (None, '') else s.default}"
            f" | {s.doc} |" for s in SETTINGS.values()]
    return "\n".join([
        "# Settings", "",
        ("Every environment variable portkit reads. This page is generated from "
         "`portkit/settings.py` (`python -m portkit.settings > docs/settings.md`); a test "
         "checks that it matches."), "",
        "| variable | value | default | what it does |", "|---|---|---|---|", *rows, ""])


if __name__ == "__main__":
    print(markdown(), end="")
