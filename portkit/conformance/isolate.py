"""Runs conformance cases in a worker process, so that a crash or a hang costs one case.

One long-lived worker loads the backend from its entry point, collects the same cases as the
runner and runs them one by one on request, keeping its compiled kernels between cases. When it
dies (a signal, os._exit, an abort) the case it was running is `crashed`; when a case runs past
`Options.timeout` the worker is killed and the case is `timeout`. Either way the next case
starts a fresh worker, which reuses the disk cache. Workers are spawned, not forked: a forked
driver's threads (PoCL's, wgpu's) do not exist in the child.
"""
from __future__ import annotations

import faulthandler
import functools
import multiprocessing
import os
import pickle
import signal
import tempfile
import time
from importlib import metadata
from multiprocessing import connection
from pathlib import Path
from typing import Any

from portkit import backends
from portkit.abi import Capabilities, PortkitError
from portkit.conformance import replay, suite
from portkit.conformance.case import Case, KernelCase, Outcome, Status
from portkit.conformance.target import Target
from portkit.runtime import progress

# How long the worker may take to load the backend and collect the cases.
START_SECONDS = 300.0


class WorkerError(PortkitError):
    """The worker process could not load the backend; the message says why."""


class WorkerTarget(Target):
    """The backend under test as the runner sees it when every case runs in a worker: its
    name, its entry point and the capabilities the worker reports. The backend is loaded only
    in the worker (after the probe that checks it loads): twice in all, not three times."""

    def __init__(self, name: str, origin: str, options: suite.Options):
        self.name, self.origin, self.device, self.runtime = name, origin, None, None
        self.isolated = Isolated(self, options)

    @property
    def capabilities(self) -> Capabilities:
        """The capabilities the worker's backend declares (starting the worker)."""
        return self.isolated.start()


class Isolated:
    """Runs each case in the worker process; the runner's other half of `suite.InProcess`."""

    def __init__(self, target: Target, options: suite.Options):
        if target.origin is None:
            raise ValueError(f"--isolate process needs a backend loaded by name; "
                             f"{target.name!r} was handed in as a Device: use --isolate none")
        self.target, self.options = target, options
        self.worker: _Worker | None = None
        self.capabilities: Capabilities | None = None   # what the first worker reported

    def start(self) -> Capabilities:
        """Starts the worker unless one runs; the capabilities the backend declared there.
        Raises WorkerError when it cannot load the backend."""
        if self.worker is None:
            self.worker = _Worker(self.target.name, self.target.origin, self.options)
            self.capabilities = self.capabilities or self.worker.capabilities
        return self.capabilities

    def precompile(self, cases: list[Case], report: progress.Report | None = None
                   ) -> dict[str, KernelCase | Exception]:
        """Has the worker make and compile the kernel cases of `cases`, and the kernels the
        others say they will compile (`Case.ahead`), on `options.jobs` threads, `report(done,
        total)` following each batch. If it dies doing so, the next worker compiles each case
        as it runs, so the crash is pinned on its case. The kernel cases stay in the worker:
        returns {}."""
        ids = [c.id for c in cases if c.make is not None or c.ahead is not None]
        if ids:
            kind, _ = self._ask(("precompile", ids), self.options.timeout * 4, report)
            if kind != "done":
                self._stop()
        return {}

    def outcome(self, case: Case, kc: KernelCase | Exception | None) -> Outcome:
        """Runs `case` in the worker: its outcome, or `crashed` / `timeout` with how the worker
        ended, where it was, and (for a kernel case) the kernel and its source to replay."""
        kind, found = self._ask(("run", case.id), self.options.timeout)
        if kind == "outcome":
            return found
        self._stop()
        outcome = Outcome(Status.CRASHED if kind == "crashed" else Status.TIMEOUT, found)
        if case.make is not None:
            made = suite.make_case(case)
            if isinstance(made, KernelCase):
                outcome.repro = made
                # The next worker renders it: the runner never loads the backend itself.
                kind, source = self._ask(("source", case.id), self.options.timeout)
                if kind == "source":
                    outcome.source = source
                else:
                    self._stop()
        return outcome

    def close(self) -> None:
        """Stops the worker."""
        self._stop()

    def _ask(self, request: tuple[str, Any], limit: float,
             report: progress.Report | None = None) -> tuple[str, Any]:
        if self.worker is not None and not self.worker.process.is_alive():
            self._stop()    # it died after its last answer: no case of this request's to blame
        self.start()
        return self.worker.ask(request, limit, report)

    def _stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None


class _Worker:
    """One worker process, its pipe and the file its fault handler writes Python stacks to."""

    def __init__(self, name: str, origin: str, options: suite.Options):
        handle, path = tempfile.mkstemp(prefix="portkit-worker-", suffix=".log")
        os.close(handle)
        self.log = Path(path)
        spawn = multiprocessing.get_context("spawn")
        self.pipe, theirs = spawn.Pipe()
        self.process = spawn.Process(target=serve, args=(theirs, name, origin, options, path),
                                     name=f"portkit conform {name}", daemon=True)
        self.process.start()
        theirs.close()
        kind, found = self._reply(START_SECONDS, 0)
        self.capabilities = found
        if kind != "ready":
            self.stop()
            raise WorkerError(f"the conformance worker could not load backend {name!r}: {found}",
                              "run `portkit backends`, or use --isolate none")

    def ask(self, request: tuple[str, Any], limit: float,
            report: progress.Report | None = None) -> tuple[str, Any]:
        """Sends `request` and waits up to `limit` seconds for the reply: (kind, value), kind
        "crashed" or "timeout" (value: what happened) when no reply came. ("compiled", (done,
        total)) messages on the way go to `report`, each starting the wait again."""
        offset = self.log.stat().st_size
        try:
            self.pipe.send(request)
        except OSError:
            pass    # it died before the request: _reply says how
        kind, value = self._reply(limit, offset)
        while kind == "compiled":
            if report is not None:
                report(*value)
            kind, value = self._reply(limit, offset)
        return kind, value

    def _reply(self, limit: float, offset: int) -> tuple[str, Any]:
        ready = connection.wait([self.pipe, self.process.sentinel], limit)
        if self.pipe in ready or self.pipe.poll():
            try:
                return self.pipe.recv()
            except (EOFError, OSError):
                pass
        if not ready:
            if hasattr(signal, "SIGUSR1"):     # the fault handler writes where it is stuck
                try:
                    os.kill(self.process.pid, signal.SIGUSR1)
                    time.sleep(0.5)
                except ProcessLookupError:
                    pass
            where = self._where(offset)
            self.stop()
            return "timeout", f"ran past the {limit:g} s limit (--timeout) and was killed{where}"
        self.process.join()
        return "crashed", (f"the worker process died running it: "
                           f"{backends.describe_exit(self.process.exitcode)}" + self._where(offset))

    def _where(self, offset: int) -> str:
        """The innermost Python frames of the stack the fault handler wrote, if any."""
        try:
            with self.log.open() as log:
                log.seek(offset)
                text = log.read()
        except OSError:
            return ""
        # The crashing (or signalled) thread's stack follows "Current thread ...:" and ends at
        # a blank line; other threads' stacks are left out.
        stack = text.rpartition("Current thread")[2].split("\n\n")[0]
        frames = [line.strip() for line in stack.splitlines()
                  if line.strip().startswith("File ")][:3]
        return "; Python stack, innermost first: " + " < ".join(frames) if frames else ""

    def stop(self) -> None:
        """Asks the worker to finish, then kills it if it does not, and removes its log."""
        if self.process.is_alive():
            try:
                self.pipe.send(("stop", None))
            except OSError:
                pass
            self.process.join(2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.pipe.close()
        self.log.unlink(missing_ok=True)


def serve(pipe: connection.Connection, name: str, origin: str, options: suite.Options,
          log_path: str) -> None:
    """The worker's loop: load the backend, collect the cases, then answer ("precompile",
    ids) and ("run", id) requests until ("stop", None) or the pipe closes."""
    with open(log_path, "a") as log:
        faulthandler.enable(log)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, log)
        try:
            found = backends.load_point(metadata.EntryPoint(name, origin, backends.GROUP))
            if isinstance(found, Exception):
                raise found
            target = Target(found, name, origin=origin)
            cases = {c.id: c for c in suite.collect(suite.context(target, options), options)[0]}
        except Exception as error:  # noqa: BLE001 - the runner reports it
            pipe.send(("error", f"{type(error).__name__}: {error}"))
            return
        runs, made = suite.InProcess(target, options), {}
        pipe.send(("ready", target.capabilities))
        while True:
            try:
                kind, argument = pipe.recv()
            except EOFError:
                return
            if kind == "stop":
                return
            if kind == "precompile":
                made.update(runs.precompile([cases[i] for i in argument], functools.partial(
                    _compiled, pipe)))
                pipe.send(("done", None))
            elif kind == "source":
                pipe.send(("source", _source(target, cases[argument])))
            else:
                _send(pipe, runs.outcome(cases[argument], made.pop(argument, None)))


def _compiled(pipe: connection.Connection, done: int, total: int) -> None:
    pipe.send(("compiled", (done, total)))


def _source(target: Target, case: Case) -> str | None:
    """The rendered source of a kernel case's kernel, or None if it cannot be had."""
    made = suite.make_case(case)
    try:
        return replay.rendered(target, target.prepare(made.kernel))
    except Exception:  # noqa: BLE001 - the case's crash is the evidence; its source a help
        return None


def _send(pipe: connection.Connection, outcome: Outcome) -> None:
    try:
        pipe.send(("outcome", outcome))
    except (pickle.PicklingError, TypeError, AttributeError):
        outcome.repro, outcome.perf = None, None    # what cannot cross the pipe
        pipe.send(("outcome", outcome))
