"""The runner: runs the collected cases in order, each after its prerequisites, in this process
or in a worker process (isolate.py), applying blocking and xfail, and reports them.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from portkit.conformance import replay
from portkit.conformance.case import BLOCKING, EVIDENCE, Case, KernelCase, Result, Status
from portkit.conformance.isolate import Isolated, WorkerTarget
from portkit.conformance.suite import (
    InProcess,
    Options,
    Report,
    collect,
    context,
    prerequisites,
    shard,
    with_prerequisites,
    xfail_reason,
)
from portkit.conformance.target import Target


def executor(target: Target, options: Options) -> InProcess | Isolated:
    """Where cases run: in a worker process (portkit.conformance.isolate) when
    `options.isolate` is "process", or "auto" and the backend was loaded by name; else here."""
    if options.isolate not in ("auto", "process", "none"):
        raise ValueError(f"isolate={options.isolate!r}: use 'auto', 'process' or 'none'")
    if isinstance(target, WorkerTarget):     # loaded only in its worker: it runs there
        return target.isolated
    if options.isolate == "none" or (options.isolate == "auto" and target.origin is None):
        return InProcess(target, options)
    return Isolated(target, options)


class Runner:
    """Runs cases of `pool` one at a time, each after its prerequisites (run on demand and
    remembered), so that blocking is the same whatever order or subset is asked for: the
    `portkit conform` loop, one shard, or one pytest item on one xdist worker."""

    def __init__(self, target: Target, options: Options, pool: list[Case],
                 runs: InProcess | Isolated | None = None):
        self.target, self.options, self.pool = target, options, pool
        self.runs = runs or InProcess(target, options)
        self.results: dict[str, Result] = {}

    def result(self, case: Case, kc: KernelCase | Exception | None = None) -> Result:
        """The result of `case` (with its kernel case, if already made), running it if needed."""
        if case.id not in self.results:
            required = [self.result(c) for c in prerequisites(case, self.pool)]
            self.results[case.id] = _run_one(self.target, case, kc, required, self.options,
                                             self.runs)
        return self.results[case.id]


def run(target: Target, options: Options,
        progress: Callable[[Result, int, int], None] | None = None,
        compiling: Callable[[int, int], None] | None = None) -> Report:
    """Runs the selected tiers (the shard of them, if `options.shard`) on `target`;
    `progress(result, done, total)` after each case that is run. Each tier's kernels are
    compiled ahead in batches (Runtime.compile_all), on `options.jobs` threads, before its
    first case runs; `compiling(done, total)` after each batch."""
    start = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cases, tiers = collect(context(target, options), options)
    chosen = shard(cases, options.shard)
    reported = {c.id for c in chosen}
    for tier_info in tiers.values():
        if tier_info["status"] == "run":
            tier_info["cases"] = sum(c.tier == tier_info["tier"] for c in chosen)
    report = Report(target.name, target.capabilities, options, tiers=tiers,
                    order={c.id: i for i, c in enumerate(cases)}, started=started)
    todo = with_prerequisites(chosen, cases)
    runner = Runner(target, options, cases, executor(target, options))
    done = 0
    try:
        for number in sorted({c.tier for c in todo}):
            batch = [c for c in todo if c.tier == number]
            made = runner.runs.precompile(batch, compiling)
            for case in batch:
                result = runner.result(case, made.get(case.id))
                done += 1
                if case.id in reported:
                    report.results.append(result)
                if progress:
                    progress(result, done, len(todo))
    finally:
        runner.runs.close()
    report.seconds = time.perf_counter() - start
    return report


def _run_one(target: Target, case: Case, kc: KernelCase | Exception | None,
             required: list[Result], options: Options, runs: InProcess | Isolated) -> Result:
    blockers = [r for r in required if r.status in BLOCKING]
    if blockers:
        names = ", ".join(f"{r.case.id} ({r.status.value})" for r in blockers[:3])
        more = f" and {len(blockers) - 3} more" if len(blockers) > 3 else ""
        return Result(case, Status.BLOCKED, f"blocked by {names}{more}")
    start = time.perf_counter()
    outcome = runs.outcome(case, kc)
    result = Result(case, outcome.status, outcome.message, outcome.max_ulp, outcome.max_error,
                    time.perf_counter() - start, outcome.worst, outcome.source,
                    perf=outcome.perf, replay=outcome.replay)
    path = Path(options.repro_dir) / (re.sub(r"[^\w.-]+", "_", case.id) + ".json")
    if outcome.repro is not None:
        result.kernel_json = outcome.repro.kernel.to_json()
        if outcome.status in EVIDENCE:
            replay.save(path, outcome.repro, case.id, target.name)
            result.repro_path = str(path)
            result.replay = f"portkit replay {path} --backend {target.name}"
    elif outcome.status in (Status.CRASHED, Status.TIMEOUT) and not result.replay:
        result.replay = f"portkit conform --backend {target.name} -k '{case.id}'"
    if outcome.status is Status.PASSED and case.make is not None:
        replay.forget(path, target.name)     # fixed: its old reproduction file is stale
    return _apply_xfail(result, options)


def _apply_xfail(result: Result, options: Options) -> Result:
    reason = xfail_reason(result.case.id, options.xfail)
    if reason is None:
        return result
    where = options.xfail_file or "the xfail list"
    if result.status in (Status.FAILED, Status.CRASHED, Status.TIMEOUT):
        how = "" if result.status is Status.FAILED else f"{result.status.value}: "
        result.status = Status.XFAIL
        result.message = f"expected failure ({reason}): {how}{result.message}"
    elif result.status is Status.PASSED:
        result.status = Status.XPASS
        result.message = (f"listed as xfail ({reason}) but PASSED: remove it from "
                          f"{where}")
    return result
