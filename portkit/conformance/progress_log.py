"""Progress of `portkit conform` as plain lines, for a log that is not a terminal (CI).

A bar means nothing in a log, and a line per case drowns it; so a line comes when both 5 s and
a tenth of the way have passed since the last one, or a minute has, and at the start and end of
each round (the kernels a tier compiles ahead, then the cases):

    portkit: compiling 32/212 kernels (3 s)
    portkit: running 120/596 cases (41 s): 110 passed, 2 failed, 8 blocked
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import IO, Any

EVERY = 5.0         # seconds: at most a line this often...
STEP = 0.1          # ...and only after this fraction of the round more is done...
LONGEST = 60.0      # ...unless this many seconds passed without a line


class LogProgress:
    """Reports compile batches (`compiled(done, total)`) and cases (`ran(result, done,
    total)`) as plain lines on `stream`; `clock` is injectable for tests."""

    def __init__(self, stream: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.stream, self.clock = stream, clock
        self.start = self.last_time = clock()
        self.last_done: dict[str, int] = {}       # per round label: done at its last line
        self.statuses: Counter[str] = Counter()

    def compiled(self, done: int, total: int) -> None:
        """After each batch of kernels compiled ahead of a tier."""
        self._report("compiling", done, total, "kernels", "")

    def ran(self, result: Any, done: int, total: int) -> None:
        """After each case, with its result (its `status.value` is counted)."""
        self.statuses[result.status.value] += 1
        counts = ", ".join(f"{self.statuses[s]} {s}" for s in ("passed", "failed", "blocked"))
        others = sum(n for s, n in self.statuses.items()
                     if s not in ("passed", "failed", "blocked"))
        self._report("running", done, total, "cases",
                     f": {counts}" + (f", {others} other" if others else ""))

    def _report(self, label: str, done: int, total: int, unit: str, tail: str) -> None:
        now = self.clock()
        last = self.last_done.get(label)
        waited = now - self.last_time
        new_round = last is None or done < last
        due = waited >= EVERY and (done - (last or 0) >= STEP * total or waited >= LONGEST)
        if not (new_round or done == total or due):
            return
        self.last_done[label], self.last_time = done, now
        print(f"portkit: {label} {done}/{total} {unit} ({now - self.start:.0f} s){tail}",
              file=self.stream or sys.stderr, flush=True)
