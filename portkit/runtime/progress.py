"""How far a long compile has come: a hook that `Runtime.compile_all` reports to, and a display
of it (a rich bar on a terminal, a plain line each tenth of the way in a log).

    with progress.shown("compiling") as show, progress.reporting(show):
        model(x)      # the first call compiles every kernel of the model in batches

Without a hook, `compile_all` shows its own progress through `delayed` once it has taken
PORTKIT_PROGRESS seconds (default 3): a first training step that compiles for a minute says so,
and a quick one prints nothing.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Report = Callable[[int, int], None]
_hook: ContextVar[Report | None] = ContextVar("portkit_compile_progress", default=None)


@contextlib.contextmanager
def reporting(report: Report | None) -> Iterator[None]:
    """Within it, `Runtime.compile_all` (on this thread) calls `report(done, total)` after
    each batch of kernels it compiles."""
    token = _hook.set(report)
    try:
        yield
    finally:
        _hook.reset(token)


def hook() -> Report | None:
    """The report that `reporting` set on this thread, if any."""
    return _hook.get()


class Lines:
    """A report as plain lines, `portkit: <label> done/total`, one each tenth of the way and
    one at the end: what a CI log keeps of a progress bar."""

    def __init__(self, label: str, stream: IO[str] | None = None):
        self.label, self.stream, self.shown = label, stream, -1

    def __call__(self, done: int, total: int) -> None:
        step = max(1, total // 10)
        if done < self.shown:    # a new round (the next tier's kernels)
            self.shown = -1
        if done == total or self.shown < 0 or done // step > self.shown // step:
            print(f"portkit: {self.label} {done}/{total}", file=self.stream or sys.stderr,
                  flush=True)
            self.shown = done


@contextlib.contextmanager
def shown(label: str, console: Console | None = None) -> Iterator[Report]:
    """A report that shows `label` and done/total: a transient rich bar when the console
    (default: stderr) is a terminal, `Lines` otherwise."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield Lines(label, console.file)
        return
    with Progress(TimeElapsedColumn(), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@contextlib.contextmanager
def delayed(label: str, after: float, total: int) -> Iterator[Report]:
    """A report that shows nothing until `after` seconds have passed, then `shown(label)` with
    the last done/total (0/`total` before the first report) and every report after it."""
    last, lock, stack = [0, total], threading.Lock(), contextlib.ExitStack()
    display: list[Report] = []

    def start() -> None:
        with lock:
            if not display:
                display.append(stack.enter_context(shown(label)))
                display[0](*last)

    def report(done: int, total: int) -> None:
        with lock:
            last[:] = done, total
            if display:
                display[0](done, total)

    timer = threading.Timer(after, start)
    timer.daemon = True
    if after > 0:
        timer.start()
    else:
        start()
    try:
        yield report
    finally:
        timer.cancel()
        with lock:
            display.append(report)      # a timer firing now finds it taken and shows nothing
            stack.close()
