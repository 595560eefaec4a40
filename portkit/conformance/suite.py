"""The tier registry and the runner: collects cases, applies blocking and xfail, runs them.

A tier is a module with TIER, NAME and `cases(ctx) -> list[Case]` (the `Tier` protocol); one
that cannot run here (the Tensor stack is missing, say) raises TierNotRun and is reported as
not run, with the reason.
"""
from __future__ import annotations

import fnmatch
import importlib
import inspect
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from portkit.abi import CapabilityError
from portkit.abi.ops import COMPUTE
from portkit.conformance import replay
from portkit.conformance.case import (
    EVIDENCE,
    FAILING,
    Case,
    CaseFailed,
    Context,
    KernelCase,
    Outcome,
    Result,
    Status,
    TierNotRun,
    Unsupported,
    judge,
)
from portkit.conformance.target import Target

if TYPE_CHECKING:
    from portkit.conformance.isolate import Isolated

TIERS = {
    1: "portkit.conformance.tier1_runtime",
    2: "portkit.conformance.tier2_ops",
    3: "portkit.conformance.tier3_kernels",
    4: "portkit.conformance.tier4_tensor",
    5: "portkit.conformance.tier5_models",
    6: "portkit.conformance.tier6_perf",
    7: "portkit.conformance.tier7_stress",
}


@runtime_checkable
class Tier(Protocol):
    """What every tier module provides: its number, its name and its cases for a run."""

    TIER: int
    NAME: str

    def cases(self, ctx: Context) -> list[Case]:
        """The tier's cases for the run that `ctx` describes (capabilities, quick, seed)."""
        ...


def tier(number: int) -> Tier:
    """The module of tier `number`, checked against `Tier`: its `cases` takes one `ctx`."""
    module = importlib.import_module(TIERS[number])
    parameters = list(inspect.signature(module.cases).parameters) if hasattr(
        module, "cases") else None
    if not isinstance(module, Tier) or parameters != ["ctx"]:
        raise TypeError(f"{module.__name__} must define TIER, NAME and cases(ctx: Context), "
                        f"not cases({', '.join(parameters or [])})")
    return module


# A prerequisite with one of these statuses blocks the cases that require it.
_BLOCKING = (Status.FAILED, Status.BLOCKED, Status.XFAIL, Status.CRASHED, Status.TIMEOUT)


@dataclass
class Options:
    """What to run: the command line's options."""

    tiers: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
    pattern: str | None = None
    dtypes: tuple[str, ...] = ()
    quick: bool = False
    seed: int = 0
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)    # compile threads
    xfail: dict[str, str] = field(default_factory=dict)    # case-id pattern -> reason
    xfail_file: str | None = None
    perf_min_ratio: float | None = None
    repro_dir: str = "reports/repro"
    reference: str | None = "cpu"       # the backend that tier 6 compares timings with
    shard: tuple[int, int] | None = None    # (I, N): run only slice I of N (I from 1)
    isolate: str = "auto"       # "process": cases run in a worker process; "none": in this one
    timeout: float = 300.0      # seconds a case may run in a worker before it is killed


@dataclass
class Report:
    """Everything one run found: results in order and the tiers that did not run."""

    backend: str
    capabilities: object
    options: Options
    results: list[Result] = field(default_factory=list)
    tiers: dict[str, dict] = field(default_factory=dict)    # tier name -> status and reason
    seconds: float = 0.0
    order: dict[str, int] = field(default_factory=dict)    # case id -> place in the whole run
    started: str = ""                                       # UTC, ISO 8601

    def counts(self) -> dict[str, int]:
        """How many results have each status (every status listed, zeros too)."""
        counts = {status.value: 0 for status in Status}
        for result in self.results:
            counts[result.status.value] += 1
        return counts

    @property
    def ok(self) -> bool:
        """True when nothing failed and no xfail entry is stale (the exit code's rule)."""
        return not any(r.status in FAILING for r in self.results)


def parse_xfail(text: str, source: str = "xfail file") -> dict[str, str]:
    """Reads an xfail list: one `CASE-ID-PATTERN  reason` per line; `#` starts a comment."""
    entries = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 1)
        if len(parts) < 2:
            raise ValueError(f"{source}:{number}: {parts[0]!r} has no reason; write "
                             "`PATTERN  why it fails` so the list stays honest")
        entries[parts[0]] = parts[1]
    return entries


def matches(case_id: str, pattern: str) -> bool:
    """-k semantics: a glob if the pattern has *, ? or [, else a substring."""
    if re.search(r"[*?\[]", pattern):
        return fnmatch.fnmatchcase(case_id, pattern)
    return pattern in case_id


def collect(ctx: Context, options: Options) -> tuple[list[Case], dict[str, dict]]:
    """The selected cases, and per tier whether it runs (and why not)."""
    selected, tiers = [], {}
    for number in sorted(options.tiers):
        module = tier(number)
        try:
            found = module.cases(ctx)
        except TierNotRun as reason:
            tiers[module.NAME] = {"tier": number, "status": "not run", "reason": str(reason)}
            continue
        found = [c for c in found if _selected(c, options)]
        tiers[module.NAME] = {"tier": number, "status": "run", "reason": "", "cases": len(found)}
        selected += found
    return selected, tiers


def _selected(case: Case, options: Options) -> bool:
    if options.pattern and not matches(case.id, options.pattern):
        return False
    if options.dtypes and case.dtype:
        return bool(set(case.dtype.split("->")) & set(options.dtypes))
    return True


def parse_shard(text: str) -> tuple[int, int]:
    """`I/N` (1 <= I <= N) as (I, N); ValueError naming the form otherwise."""
    found = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not found or not 1 <= int(found[1]) <= int(found[2]):
        raise ValueError(f"--shard {text!r}: write I/N with 1 <= I <= N, e.g. --shard 2/4 for "
                         "the second of four slices")
    return int(found[1]), int(found[2])


def shard(cases: list[Case], which: tuple[int, int] | None) -> list[Case]:
    """Slice I of N of `cases`, dealt round-robin so that every slice gets some of each tier;
    the same selection always gives the same slices."""
    if which is None:
        return list(cases)
    index, count = which
    return list(cases[index - 1::count])


def prerequisites(case: Case, pool: list[Case]) -> list[Case]:
    """The cases of `pool` that `case` requires: lower tiers whose ids match its patterns,
    pattern by pattern (the order a blocked case names its blockers in)."""
    found: dict[str, Case] = {}
    for pattern in case.requires:
        found.update((c.id, c) for c in pool
                     if c.tier < case.tier and fnmatch.fnmatchcase(c.id, pattern))
    return list(found.values())


def with_prerequisites(chosen: list[Case], pool: list[Case]) -> list[Case]:
    """`chosen` and, transitively, everything in `pool` they require, in `pool`'s order. A shard
    runs these too, unreported, so that its blocked cases are those of the whole run."""
    wanted = {c.id for c in chosen}
    frontier = list(chosen)
    while frontier:
        for needed in prerequisites(frontier.pop(), pool):
            if needed.id not in wanted:
                wanted.add(needed.id)
                frontier.append(needed)
    return [c for c in pool if c.id in wanted]


class InProcess:
    """Runs cases in this process: no start-up cost, but a crash in the backend ends the run
    and a hang stops it (`--isolate none`)."""

    def __init__(self, target: Target, options: Options):
        self.target, self.options = target, options

    def precompile(self, cases: list[Case]) -> dict[str, KernelCase | Exception]:
        """Makes the kernel cases of `cases` and compiles their kernels on `options.jobs`
        threads, so that running them later only launches: case id -> its kernel case."""
        made = {c.id: make_case(c) for c in cases if c.make is not None}
        self.target.precompile([kc.kernel for kc in made.values()
                                if isinstance(kc, KernelCase)], self.options.jobs)
        return made

    def outcome(self, case: Case, kc: KernelCase | Exception | None) -> Outcome:
        """Runs `case` (with its kernel case, if made) and returns what it produced."""
        return execute(self.target, case, kc)

    def close(self) -> None:
        """Nothing to release in this process."""


def executor(target: Target, options: Options) -> InProcess | Isolated:
    """Where cases run: in a worker process (portkit.conformance.isolate) when
    `options.isolate` is "process", or "auto" and the backend was loaded by name; else here."""
    if options.isolate not in ("auto", "process", "none"):
        raise ValueError(f"isolate={options.isolate!r}: use 'auto', 'process' or 'none'")
    from portkit.conformance.isolate import Isolated, WorkerTarget

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


def context(target: Target, options: Options) -> Context:
    """What the tiers build their cases from, for a run of `options` on `target`."""
    return Context(target.capabilities, options.quick, options.seed,
                   reference_target(target, options), options.perf_min_ratio)


def run(target: Target, options: Options,
        progress: Callable[[Result, int, int], None] | None = None) -> Report:
    """Runs the selected tiers (the shard of them, if `options.shard`) on `target`;
    `progress(result, done, total)` after each case that is run. Each tier's kernels are
    compiled ahead, on `options.jobs` threads, before its first case runs."""
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
            made = runner.runs.precompile(batch)
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


def reference_target(target: Target, options: Options) -> Target | None:
    """The backend tier 6 compares timings with (`options.reference`), or None without it."""
    if 6 not in options.tiers or not options.reference:
        return None
    if options.reference == target.name:
        return target
    try:
        return Target.load(options.reference)
    except Exception:  # noqa: BLE001 - any reason to lack it just drops the ratios
        return None


def make_case(case: Case) -> KernelCase | Exception:
    """The kernel case `case.make()` builds, or the exception it raised (the case's failure,
    reported when it runs)."""
    try:
        return case.make()
    except Exception as error:  # noqa: BLE001 - reported as the case's failure when it runs
        return error


def _run_one(target: Target, case: Case, kc: KernelCase | Exception | None,
             required: list[Result], options: Options, runs: InProcess | Isolated) -> Result:
    blockers = [r for r in required if r.status in _BLOCKING]
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
    reasons = [r for p, r in options.xfail.items() if fnmatch.fnmatchcase(result.case.id, p)]
    if not reasons:
        return result
    where = options.xfail_file or "the xfail list"
    if result.status in (Status.FAILED, Status.CRASHED, Status.TIMEOUT):
        how = "" if result.status is Status.FAILED else f"{result.status.value}: "
        result.status = Status.XFAIL
        result.message = f"expected failure ({reasons[0]}): {how}{result.message}"
    elif result.status is Status.PASSED:
        result.status = Status.XPASS
        result.message = (f"listed as xfail ({reasons[0]}) but PASSED: remove it from "
                          f"{where}")
    return result


def execute(target: Target, case: Case, kc: KernelCase | Exception | None = None) -> Outcome:
    """Runs one case (with its kernel case, if already made), turning every exception into a
    status with a message."""
    try:
        if case.fn is not None:
            return case.fn(target)
        if isinstance(kc, Exception):
            raise kc
        return run_kernel_case(target, kc or case.make())
    except (Unsupported, CapabilityError) as why:
        return Outcome(Status.UNSUPPORTED, str(why))
    except CaseFailed as why:
        return Outcome(Status.FAILED, str(why))
    except Exception as error:  # noqa: BLE001 - a crash in the backend fails this case
        return Outcome(Status.FAILED, f"{type(error).__name__}: {error}")


def run_kernel_case(target: Target, kc: KernelCase) -> Outcome:
    """Runs a kernel case on `target` and judges every checked output."""
    kernel = target.prepare(kc.kernel)
    try:
        outputs = target.run(kernel, kc.inputs, kc.scalars)
    except Exception as error:  # noqa: BLE001 - keep the kernel to replay the crash
        source = rendered(target, kernel)
        return Outcome(Status.FAILED, f"{type(error).__name__}: {error}", repro=kc,
                       source=source)
    verdicts = [judge(check, outputs[check.output], kc.inputs) for check in kc.checks]
    ulps = [v.error for v in verdicts if v.unit == "ulp"]
    errors = [v.error for v in verdicts if v.unit != "ulp"]
    failed = [v for v in verdicts if not v.ok]
    message = "; ".join([v.message for v in failed] +
                        ([rewritten(kc.kernel, kernel)] if failed else []))
    return Outcome(Status.FAILED if failed else Status.PASSED, message.rstrip("; "),
                   max(ulps) if ulps else None, max(errors) if errors else None,
                   failed[0].worst if failed else None, kc, rendered(target, kernel))


def rewritten(original, prepared) -> str:
    """What the device's decompositions put in a failing kernel (codegen/decompose.py): a
    wrong op among those fails this case too, under another op's name. "" if none."""
    def compute_ops(kernel) -> set[str]:
        return {node.op.name for node in kernel.nodes if node.op in COMPUTE}

    lacking = compute_ops(original) - compute_ops(prepared)
    if not lacking:
        return ""
    added = sorted(compute_ops(prepared) - compute_ops(original)) or ["the ops it already had"]
    return (f"this backend lacks {', '.join(sorted(lacking))}, so the kernel ran them "
            f"decomposed into {', '.join(added)}: if those ops' own cases fail, fix them first")


def rendered(target: Target, kernel) -> str | None:
    """`kernel`'s source as `target` renders it, or None if its renderer fails."""
    try:
        return target.device.renderer.render(kernel)
    except Exception:  # noqa: BLE001 - the failure's own message already says why
        return None
