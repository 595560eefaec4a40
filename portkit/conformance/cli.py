"""`portkit conform` and `portkit replay`: the conformance suite from the command line."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column

from portkit import backends
from portkit.abi import BackendUnavailable, PortkitError
from portkit.conformance import compare, replay, report, runner, suite
from portkit.conformance.case import Unsupported
from portkit.conformance.isolate import WorkerError, WorkerTarget
from portkit.conformance.progress_log import LogProgress
from portkit.conformance.target import Target

# The exit codes of `portkit conform`, pytest's where they mean the same thing.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_CODES = ("exit codes: 0 nothing failed, 1 a case failed (or an xfail entry is stale), "
              "2 usage error (bad option, backend not loadable, report path not writable, "
              "-k/--tier/--dtype/--shard selecting no case)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the `conform` and `replay` subcommands; each sets `run(args) -> exit code`."""
    conform = subparsers.add_parser(
        "conform", help="check a backend against the ABI spec and the CPU reference",
        description="Runs the conformance tiers (1 runtime, 2 ABI ops, 3 kernels, 4 Tensor ops, "
                    "5 models, 6 performance, 7 stress, 8 devices).", epilog=EXIT_CODES)
    which = conform.add_mutually_exclusive_group(required=True)
    which.add_argument("--backend", help="the backend to check (see `portkit backends`)")
    which.add_argument("--available", action="store_true",
                       help="check every backend available here, one summary line each")
    conform.add_argument("--tier", action="append", type=int, choices=sorted(suite.TIERS),
                         help="run only this tier (repeatable; default all)")
    conform.add_argument("-k", dest="pattern", help="only cases whose id contains PATTERN "
                         "(or matches it, if it has * ? [)")
    conform.add_argument("--dtype", action="append", default=[],
                         help="only cases on this dtype (repeatable)")
    conform.add_argument("--quick", action="store_true", help="a stratified sample: every op, "
                         "dtype and edge class at least once (the cpu backend on a quiet 2-core host: "
                         "about 30 s with empty kernel caches, 7 s once they hold its kernels)")
    conform.add_argument("--seed", type=int, default=0, help="random inputs' seed (default 0)")
    conform.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                         help="threads compiling kernels ahead of the run (cases themselves "
                              "run one at a time; default: one per CPU)")
    conform.add_argument("--model", metavar="FILE.onnx",
                         help="run this ONNX model on the backend and on the CPU reference, "
                              "and on a mismatch name the first diverging node")
    conform.add_argument("--inputs", metavar="FILE.npz",
                         help="the model's inputs by name (default: random, dynamic dims 1)")
    conform.add_argument("--shard", type=_shard, metavar="I/N",
                         help="run only slice I of N (deterministic; `portkit report merge` "
                              "joins the slices' --json reports)")
    conform.add_argument("--isolate", choices=("auto", "process", "none"), default="auto",
                         help="process: run the cases in a worker process, restarted after a "
                              "crash or a hang, so that one costs one case; none: in this "
                              "process (a crash ends the run); auto (default): process for "
                              "every backend loaded by name")
    conform.add_argument("--timeout", type=_seconds, default=suite.Options.timeout,
                         metavar="SECONDS", help="a case running longer in the worker is "
                         "killed and reported `timeout` (default %(default)g)")
    conform.add_argument("--json", help="write the JSON report here (folders are made)")
    conform.add_argument("--junit", help="write JUnit XML here (folders are made)")
    conform.add_argument("--html", help="write a one-file HTML report here (folders are made)")
    conform.add_argument("--xfail", help="expected failures: `CASE-PATTERN  reason` per line")
    conform.add_argument("--perf-min-ratio", type=float, help="fail a perf case whose speed "
                         "relative to the CPU reference is below this (default: only warn)")
    conform.add_argument("--repro-dir", default="reports/repro",
                         help="where failing cases are saved for `portkit replay`")
    conform.set_defaults(run=run_conform)

    again = subparsers.add_parser("replay", help="rerun one saved failing conformance case")
    again.add_argument("file", help="a reproduction file named in a failure's replay line")
    again.add_argument("--backend", required=True, help="the backend to run it on")
    again.add_argument("--show", action="store_true",
                       help="first print the kernel as the backend runs it (after its "
                            "decompositions) and the source it renders")
    again.set_defaults(run=run_replay)

    reports = subparsers.add_parser("report", help="merge shards' JSON reports, or compare "
                                    "two runs").add_subparsers(dest="action", required=True)
    merge = reports.add_parser(
        "merge", help="join the JSON reports of one run's shards (or boards) into one",
        description="Joins `portkit conform --shard I/N --json` reports into the report of the "
                    "whole run, in its order.", epilog="exit codes: 0 the merged run passed, "
                    "1 a case failed, 2 the reports cannot be merged")
    merge.add_argument("reports", nargs="+", help="JSON reports of `portkit conform --json`")
    merge.add_argument("--json", help="write the merged JSON report here")
    merge.add_argument("--junit", help="write the merged JUnit XML here")
    merge.add_argument("--html", help="write the merged HTML report here")
    merge.set_defaults(run=run_merge)
    change = reports.add_parser(
        "diff", help="new failures, fixes and perf moves from an OLD run to a NEW one",
        epilog="exit codes: 0 no regression, 1 a new failure or a benchmark slower beyond "
               "--noise, 2 the reports cannot be read")
    change.add_argument("old", help="the earlier JSON report (last night)")
    change.add_argument("new", help="the later JSON report (tonight)")
    change.add_argument("--noise", type=float, default=0.25,
                        help="a benchmark moves only when its median time changes by more "
                             "than this fraction (default 0.25)")
    change.add_argument("--html", help="write the diff as an HTML page here")
    change.set_defaults(run=run_diff)


def _shard(text: str) -> tuple[int, int]:
    try:
        return suite.parse_shard(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"--timeout {text!r}: write a number of seconds "
                                         "above 0, e.g. --timeout 60")
    return seconds


def options_from(args: argparse.Namespace) -> suite.Options:
    """The suite's options from parsed arguments."""
    xfail = {}
    if args.xfail:
        xfail = suite.parse_xfail(Path(args.xfail).read_text(), args.xfail)
    return suite.Options(
        tiers=tuple(args.tier or sorted(suite.TIERS)), pattern=args.pattern,
        dtypes=tuple(args.dtype), quick=args.quick, seed=args.seed, jobs=args.jobs,
        xfail=xfail, xfail_file=args.xfail, perf_min_ratio=args.perf_min_ratio,
        repro_dir=args.repro_dir, shard=args.shard, isolate=args.isolate,
        timeout=args.timeout)


def run_conform(args: argparse.Namespace) -> int:
    """`portkit conform`: 0 when nothing failed, 1 when something did, 2 on a usage error
    (a selection of no case included)."""
    console = Console()
    try:
        options = options_from(args)
        prepare_outputs([args.json, args.junit, args.html])
    except (OSError, ValueError) as error:
        console.print(f"[red]{escape(str(error))}[/]")
        return EXIT_USAGE
    if args.available:
        return _run_available(options, args, console)
    try:
        target = None
        if options.isolate != "none":     # a backend that ends the process ends only a probe
            found = backends.probe([args.backend])[0]
            if found.status != "available":
                raise BackendUnavailable(found.detail, found.fix)
            point = backends.entry_point(args.backend)
            if point is not None and not args.model:   # then loaded only in the worker
                target = WorkerTarget(args.backend, point.value, options)
        target = target or Target.load(args.backend)
    except PortkitError as error:
        console.print(f"[red]cannot load backend {args.backend!r}: {escape(str(error))}[/]")
        return EXIT_USAGE
    if args.model:
        return _run_model(target, options, args, console)
    # a CI log gets a plain line every few seconds (progress_log); a terminal gets the bar
    log = None if console.is_terminal else LogProgress(console.file)
    with progress_bar(console) as progress:
        task = progress.add_task(f"conform {target.name}", total=None)

        def compiled(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total,
                            description=escape(f"{target.name}: compiling kernels"))
            if log:
                log.compiled(done, total)

        def advance(result, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total,
                            description=escape(f"{target.name}: {result.case.id}"))
            if log:
                log.ran(result, done, total)

        try:
            result = runner.run(target, options, advance, compiled)
        except WorkerError as error:
            console.print(f"[red]{escape(str(error))}[/]")
            return EXIT_USAGE
    if not result.results:
        console.print(f"[red]{escape(no_case_message(args))}[/]")
        return EXIT_USAGE
    report.print_terminal(result, console)
    write_reports(report.to_dict(result), args)
    return EXIT_OK if result.ok else EXIT_FAILED


def no_case_message(args: argparse.Namespace) -> str:
    """Why a run selected no case: the selection it was given, and how to list case ids."""
    chosen = [f"-k {args.pattern!r}" if args.pattern else "",
              " ".join(f"--tier {n}" for n in args.tier or []),
              " ".join(f"--dtype {d}" for d in args.dtype),
              f"--shard {args.shard[0]}/{args.shard[1]}" if args.shard else ""]
    quick = " --portkit-quick" if args.quick else ""
    return (f"no case selected by {' '.join(filter(None, chosen)) or 'these options'}: -k is a "
            "substring of the case id, or a glob if it has * ? [ (e.g. -k 'ops/SIN/*'); list "
            f"the case ids with `pytest --portkit-backend {args.backend or 'NAME'}{quick} "
            "--collect-only -q`")


def _run_model(target: Target, options: suite.Options, args: argparse.Namespace,
               console: Console) -> int:
    """`portkit conform --model`: each graph output is a case; exit codes as for the tiers."""
    from portkit.conformance import model

    try:
        result = model.check(target, args.model, args.inputs, options)
    except (PortkitError, OSError, ValueError, ImportError) as error:
        console.print(f"[red]cannot run the model {args.model}: {escape(str(error))}[/]")
        return EXIT_USAGE
    report.print_terminal(result, console)
    write_reports(report.to_dict(result), args)
    return EXIT_OK if result.ok else EXIT_FAILED


def progress_bar(console: Console) -> Progress:
    """The run's progress: elapsed, ETA, bar, cases done and the current case. The bar takes
    what room is left, so that at 80 columns a case name is shown whole."""
    return Progress(TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                    BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5)),
                    MofNCompleteColumn(),
                    TextColumn("{task.description}", table_column=Column(no_wrap=True)),
                    console=console, transient=True, expand=True)


def prepare_outputs(paths: list[str | None]) -> None:
    """Makes the folders of the report files before a run, so that a path that cannot be
    written is a usage error at once and not a traceback after an hour of cases."""
    for path in filter(None, paths):
        folder = Path(path).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OSError(f"cannot write a report to {path}: {error.strerror or error} "
                          f"({folder}); choose another path") from None
        if Path(path).is_dir() or not os.access(folder, os.W_OK):
            raise OSError(f"cannot write a report to {path}: it is a folder or {folder} is not "
                          "writable; choose another path")


def _run_available(options: suite.Options, args: argparse.Namespace, console: Console) -> int:
    worst, ran = EXIT_OK, 0
    for found in backends.probe():     # in a child: a backend that ends it is only listed
        if found.status != "available":
            console.print(f"{found.name:12} [dim]not available: {escape(found.detail)}[/]")
            continue
        try:
            result = runner.run(Target.load(found.name), options)
        except PortkitError as error:
            console.print(f"{found.name:12} [bold red]FAILED[/] {escape(str(error))}")
            worst = EXIT_FAILED
            continue
        ran += len(result.results)
        counts = ", ".join(f"{v} {k}" for k, v in result.counts().items() if v)
        verdict = "[green]OK[/]" if result.ok else "[bold red]FAILED[/]"
        console.print(f"{found.name:12} {verdict} {counts} ({result.seconds:.1f} s)")
        worst = max(worst, EXIT_OK if result.ok else EXIT_FAILED)
    if not ran:
        console.print(f"[red]{escape(no_case_message(args))}[/]")
    return worst if ran else EXIT_USAGE


def write_reports(data: dict, args: argparse.Namespace) -> None:
    """Writes the JSON document `data` (report.to_dict) as each of --json, --junit, --html."""
    if args.json:
        report.write_json(data, args.json)
    if args.junit:
        report.write_junit(data, args.junit)
    if args.html:
        report.write_html(data, args.html)


def run_replay(args: argparse.Namespace) -> int:
    """`portkit replay FILE --backend NAME`: 0 if the case now passes, 1 if it still fails."""
    console = Console()
    try:
        target = Target.load(args.backend)
        kc, meta = replay.load(args.file)
        if args.show:       # before the launch, which may crash this process
            replay.check_bounds(kc)
            console.print(replay.describe(kc, target), markup=False, highlight=False,
                          soft_wrap=True)
        verdicts = replay.replay(kc, target)
    except (PortkitError, OSError, ValueError, Unsupported) as error:
        console.print(f"[red]{escape(str(error))}[/]")
        return EXIT_USAGE
    console.print(escape(f"case {meta['case']} (saved from backend {meta['backend']}), kernel "
                         f"{kc.kernel.name}, on {target.name}:"))
    for verdict in verdicts:
        console.print("[green]passes[/]" if verdict.ok else
                      f"[red]fails[/]: {escape(verdict.message)}")
    return 0 if all(v.ok for v in verdicts) else 1


def run_merge(args: argparse.Namespace) -> int:
    """`portkit report merge`: 0 when the merged run passed, 1 when a case failed, 2 when the
    reports cannot be merged or written."""
    console = Console()
    try:
        prepare_outputs([args.json, args.junit, args.html])
        merged = compare.merge([compare.load(path) for path in args.reports], args.reports)
    except (PortkitError, OSError) as error:
        console.print(f"[red]{escape(str(error))}[/]")
        return EXIT_USAGE
    write_reports(merged, args)
    counts = ", ".join(f"{v} {k}" for k, v in merged["summary"].items()
                       if isinstance(v, int) and v and k != "total")
    verdict = "[green]OK[/]" if merged["ok"] else "[bold red]FAILED[/]"
    console.print(f"{verdict}: {len(args.reports)} reports, {counts or 'no cases'}")
    return EXIT_OK if merged["ok"] else EXIT_FAILED


def run_diff(args: argparse.Namespace) -> int:
    """`portkit report diff OLD NEW`: 1 on a regression, 0 otherwise, 2 on unreadable input."""
    console = Console()
    try:
        prepare_outputs([args.html])
        old, new = compare.load(args.old), compare.load(args.new)
    except (PortkitError, OSError) as error:
        console.print(f"[red]{escape(str(error))}[/]")
        return EXIT_USAGE
    found = compare.diff(old, new, args.noise)
    compare.print_diff(found, console)
    if args.html:
        compare.write_diff_html(found, old, new, args.html)
    return EXIT_FAILED if found.regressed else EXIT_OK
