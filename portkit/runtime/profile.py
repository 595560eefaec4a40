"""Where the time goes: a Chrome/Perfetto trace of kernel launches, compiles, scheduling and
read-backs.

    with portkit.profile("trace.json") as prof:
        model(x).numpy()
    print(prof.table())

or `PORTKIT_PROFILE=trace.json python script.py` (written at exit), or `portkit profile
script.py`. Open the file at https://ui.perfetto.dev or chrome://tracing. While a profile is
open every launch waits for its kernel, so a kernel's span is its device time (the seconds the
program reports, else the host's clock around the launch) and launches do not overlap; the
program runs slower than it would unprofiled, as under CUDA_LAUNCH_BLOCKING.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from portkit import settings

_HOST = 1           # the trace's process for Python-side work; devices follow


@dataclass
class Profile:
    """The events recorded while a profile is open, in Chrome trace form."""

    events: list[dict[str, Any]] = field(default_factory=list)
    devices: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, category: str, name: str, start: float, seconds: float,
            device: str | None = None, **args: Any) -> None:
        """One complete span: `start` on the time.perf_counter clock, `seconds` long; on
        `device`'s track if given, else on the calling thread's."""
        with self.lock:
            if device is None:
                pid, tid = _HOST, threading.get_ident()
            else:
                pid, tid = self.devices.setdefault(device, _HOST + 1 + len(self.devices)), 0
            self.events.append({"name": name, "cat": category, "ph": "X", "pid": pid,
                                "tid": tid, "ts": start * 1e6, "dur": seconds * 1e6,
                                "args": args})

    @contextmanager
    def span(self, category: str, name: str, **args: Any) -> Iterator[None]:
        """Records the time the `with` block takes as one span on this thread."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(category, name, start, time.perf_counter() - start, **args)

    def chrome(self) -> dict[str, Any]:
        """The trace as Chrome's JSON object format (Perfetto reads it too)."""
        names = [(_HOST, "host (Python)")]
        names += [(pid, f"device {device}") for device, pid in self.devices.items()]
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
                for pid, name in names]
        return {"traceEvents": meta + list(self.events), "displayTimeUnit": "ms"}

    def save(self, path: str | os.PathLike) -> None:
        """Writes `chrome()` to `path`."""
        with open(path, "w") as file:
            json.dump(self.chrome(), file)

    def totals(self, category: str = "kernel") -> list[tuple[str, int, float]]:
        """(name, count, total seconds) of each span name in `category`, most time first."""
        found: dict[str, list[float]] = {}
        for event in self.events:
            if event["cat"] == category:
                found.setdefault(event["name"], []).append(event["dur"] / 1e6)
        return sorted(((n, len(s), sum(s)) for n, s in found.items()), key=lambda r: -r[2])


current: Profile | None = None       # the open profile; read on every launch


@contextmanager
def profile(path: str | os.PathLike | None = None) -> Iterator[Profile]:
    """Records launches, compiles, realizes and read-backs in the `with` block (one profile
    at a time, for the whole process); writes the trace to `path` at the end if given."""
    global current
    if current is not None:
        raise RuntimeError("a portkit profile is open already; close it before opening one")
    current = Profile()
    try:
        yield current
    finally:
        done, current = current, None
        if path is not None:
            done.save(path)


def _from_setting() -> None:
    """PORTKIT_PROFILE=FILE: profile the whole process and write FILE at exit."""
    global current
    path = settings.read("PORTKIT_PROFILE")
    if path and current is None:
        current = Profile()
        atexit.register(current.save, path)


_from_setting()
