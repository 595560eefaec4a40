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
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from portkit import runtime
from portkit.abi import CapabilityError
from portkit.conformance import replay
from portkit.conformance.case import (
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
from portkit.runtime import progress

TIERS = {
    1: "portkit.conformance.tier1_runtime",
    2: "portkit.conformance.tier2_ops",
    3: "portkit.conformance.tier3_kernels",
    4: "portkit.conformance.tier4_tensor",
    5: "portkit.conformance.tier5_models",
    6: "portkit.conformance.tier6_perf",
    7: "portkit.conformance.tier7_stress",
    8: "portkit.conformance.tier8_devices",
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


@dataclass
class Options:
    """What to run: the command line's options."""

    tiers: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    pattern: str | None = None
    dtypes: tuple[str, ...] = ()
    quick: bool = False
    seed: int = 0
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)    # compile threads
    xfail: dict[str, str] = field(default_factory=dict)    # parse_xfail: pattern -> why
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
    """Reads an xfail list: one `CASE-ID-PATTERN  reason` per line (a glob on the case id); a
    line `!CASE-ID-PATTERN` (a reason is optional) takes the cases it matches out of every
    entry, so `ops/MAX/*` can spare `!ops/MAX/int*`; `#` starts a comment."""
    entries = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split(None, 1)
        if parts[0] == "!":
            raise ValueError(f"{source}:{number}: write `!PATTERN` (no space) to take the "
                             "cases PATTERN matches out of the list")
        if len(parts) < 2 and not parts[0].startswith("!"):
            raise ValueError(f"{source}:{number}: {parts[0]!r} has no reason; write "
                             "`PATTERN  why it fails` so the list stays honest")
        entries[parts[0]] = parts[1] if len(parts) > 1 else ""
    return entries


def xfail_reason(case_id: str, entries: dict[str, str]) -> str | None:
    """The reason of the first xfail entry whose pattern matches `case_id`; None when none
    does, or when a `!PATTERN` entry matches it (whatever the order of the lines)."""
    if any(p.startswith("!") and fnmatch.fnmatchcase(case_id, p[1:]) for p in entries):
        return None
    return next((reason for p, reason in entries.items()
                 if not p.startswith("!") and fnmatch.fnmatchcase(case_id, p)), None)


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

    def precompile(self, cases: list[Case], report: progress.Report | None = None
                   ) -> dict[str, KernelCase | Exception]:
        """Makes the kernel cases of `cases` and compiles their kernels, and the kernels the
        other cases say they will compile (`Case.ahead`), on `options.jobs` threads, so that
        running them later only launches: case id -> its kernel case. `report(done, total)`
        follows each batch of kernels compiled."""
        made = {c.id: make_case(c) for c in cases if c.make is not None}
        planned: dict[str, list] = {}
        for case in cases:
            if case.ahead is not None:
                try:
                    device, kernels = case.ahead(self.target)
                except Exception:  # noqa: BLE001, S112 - the case's own run reports it
                    continue
                planned.setdefault(device, []).extend(kernels)
        with progress.reporting(report):
            self.target.precompile([kc.kernel for kc in made.values()
                                    if isinstance(kc, KernelCase)], self.options.jobs)
            for device, kernels in planned.items():
                runtime.get(device).compile_all(kernels, self.options.jobs)
        return made

    def outcome(self, case: Case, kc: KernelCase | Exception | None) -> Outcome:
        """Runs `case` (with its kernel case, if made) and returns what it produced."""
        return execute(self.target, case, kc)

    def close(self) -> None:
        """Nothing to release in this process."""


def context(target: Target, options: Options) -> Context:
    """What the tiers build their cases from, for a run of `options` on `target`."""
    return Context(target.capabilities, options.quick, options.seed,
                   reference_target(target, options), options.perf_min_ratio)


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
        source = replay.rendered(target, kernel)
        return Outcome(Status.FAILED, f"{type(error).__name__}: {error}", repro=kc,
                       source=source)
    verdicts = [judge(check, outputs[check.output], kc.inputs) for check in kc.checks]
    ulps = [v.error for v in verdicts if v.unit == "ulp"]
    errors = [v.error for v in verdicts if v.unit != "ulp"]
    failed = [v for v in verdicts if not v.ok]
    message = "; ".join([v.message for v in failed] +
                        ([replay.rewritten(kc.kernel, kernel)] if failed else []))
    return Outcome(Status.FAILED if failed else Status.PASSED, message.rstrip("; "),
                   max(ulps) if ulps else None, max(errors) if errors else None,
                   failed[0].worst if failed else None, kc, replay.rendered(target, kernel))
