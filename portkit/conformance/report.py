"""Reports of a conformance run: JSON (versioned schema), JUnit XML, one-file HTML, terminal.

The JSON document (`to_dict`) is the one form every other report is written from, so a report
merged from shards (portkit.conformance.compare) writes the same HTML and JUnit as a run. Its
schema is the file report.schema.json shipped beside this module (version 3; fields are only
ever added within a version).
"""
from __future__ import annotations

import json
import math
import re
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

import portkit
from portkit.abi import ABI_VERSION, dtypes
from portkit.conformance.case import EVIDENCE, Status
from portkit.conformance.suite import Report

SCHEMA_VERSION = 3   # 3: statuses crashed and timeout; 2: capabilities lost fixed_block
READABLE_VERSIONS = (2, 3)    # 3 only added to 2, so a version 2 report still reads
_STYLE = {"passed": "green", "failed": "bold red", "blocked": "yellow", "unsupported": "dim",
          "xfail": "magenta", "xpass": "bold magenta", "crashed": "bold red reverse",
          "timeout": "bold red reverse"}


def capabilities_dict(caps: Any) -> dict[str, Any]:
    """The declared capabilities as plain JSON values."""
    return {
        "dtypes": sorted(d.name for d in caps.dtypes), "ops": sorted(op.name for op in caps.ops),
        "max_block_threads": caps.max_block_threads, "max_block": list(caps.max_block),
        "max_grid": list(caps.max_grid), "local_memory_bytes": caps.local_memory_bytes,
        "max_buffers": caps.max_buffers, "denormals": caps.denormals,
        "peak_gflops": caps.peak_gflops,
        "peak_bandwidth_gbs": caps.peak_bandwidth_gbs,
    }


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of `to_dict`'s document, as shipped in the package."""
    text = resources.files("portkit.conformance").joinpath("report.schema.json").read_text()
    return json.loads(text)


def to_dict(report: Report) -> dict[str, Any]:
    """The run as the versioned JSON document that report.schema.json describes."""
    summary: dict[str, Any] = report.counts()
    summary["total"] = len(report.results)
    summary["not_run"] = {name: t["reason"] for name, t in report.tiers.items()
                          if t["status"] != "run"}
    cases = []
    for r in report.results:
        evidence = r.status in EVIDENCE
        cases.append({
            "id": r.case.id, "index": report.order.get(r.case.id), "tier": r.case.tier,
            "op": r.case.op, "dtype": r.case.dtype,
            "status": r.status.value, "max_ulp": r.max_ulp, "max_error": r.max_error,
            "message": r.message, "seconds": round(r.seconds, 6), "worst": r.worst,
            "replay": r.replay, "repro_path": r.repro_path,
            "kernel": json.loads(r.kernel_json) if evidence and r.kernel_json else None,
            "source": r.source if evidence else None,
        })
    options = report.options
    return {
        "schema_version": SCHEMA_VERSION, "backend": report.backend, "abi_version": ABI_VERSION,
        "portkit_version": portkit.__version__,
        "device": report.capabilities.device_name or report.backend,
        "capabilities": capabilities_dict(report.capabilities),
        "options": {"tiers": list(options.tiers), "pattern": options.pattern,
                    "dtypes": list(options.dtypes), "quick": options.quick,
                    "seed": options.seed, "xfail_file": options.xfail_file,
                    "perf_min_ratio": options.perf_min_ratio,
                    "isolate": options.isolate, "timeout": options.timeout,
                    "shard": "{}/{}".format(*options.shard) if options.shard else None},
        "started": report.started or datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(report.seconds, 3), "ok": report.ok, "summary": summary,
        "tiers": report.tiers, "cases": cases,
        "perf": [{**r.perf, "case": r.case.id} for r in report.results if r.perf],
    }


def _document(report: Report | dict[str, Any]) -> dict[str, Any]:
    return report if isinstance(report, dict) else to_dict(report)


def write_json(report: Report | dict[str, Any], path: str | Path) -> None:
    """Writes the JSON report (of a run, or a document from `to_dict`)."""
    Path(path).write_text(json.dumps(_document(report), indent=1, default=_jsonable))


def _jsonable(value: Any) -> Any:
    return float(value) if hasattr(value, "__float__") else str(value)


def write_junit(report: Report | dict[str, Any], path: str | Path) -> None:
    """Writes JUnit XML: a testsuite per tier with the attributes CI tools read (tests,
    failures, errors, skipped, time, timestamp, hostname) and the run's facts as properties;
    blocked, unsupported and xfail cases are skips, a tier not run is one skip with why."""
    data = _document(report)
    backend = data["backend"]
    root = ET.Element("testsuites", name=f"portkit conform {backend}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0.0}
    for name, tier in data["tiers"].items():
        cases = [c for c in data["cases"] if c["tier"] == tier["tier"]]
        suite = ET.SubElement(root, "testsuite", name=f"{backend}.{name}",
                              timestamp=data.get("started", ""), hostname=socket.gethostname())
        properties = ET.SubElement(suite, "properties")
        for key, value in (("backend", backend), ("device", data["device"]),
                           ("abi_version", data["abi_version"]),
                           ("portkit_version", data["portkit_version"]),
                           ("seed", data["options"]["seed"]),
                           ("quick", data["options"]["quick"]),
                           ("shard", data["options"].get("shard"))):
            ET.SubElement(properties, "property", name=key, value=str(value))
        counts = {"tests": max(len(cases), 1), "failures": 0, "errors": 0, "skipped": 0,
                  "time": sum(c["seconds"] for c in cases)}
        if tier["status"] != "run":
            case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name=name,
                                 time="0")
            ET.SubElement(case, "skipped", message=f"not run: {tier['reason']}")
            counts["skipped"] = 1
        for c in cases:
            case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name=c["id"],
                                 time=f"{c['seconds']:.6f}")
            if c["status"] in ("failed", "xpass", "crashed", "timeout"):
                # A crash or a hang is a JUnit error (the test could not finish), the rest
                # a failure (it finished with a wrong answer).
                kind = "error" if c["status"] in ("crashed", "timeout") else "failure"
                counts["errors" if kind == "error" else "failures"] += 1
                failure = ET.SubElement(case, kind, message=c["message"][:500],
                                        type=c["status"])
                failure.text = "\n".join(filter(None, [c["message"], c["replay"], c["source"]]))
            elif c["status"] != "passed":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"{c['status']}: {c['message']}"[:500])
        for key, value in counts.items():
            suite.set(key, f"{value:.6f}" if key == "time" else str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, f"{value:.6f}" if key == "time" else str(value))
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def grid(data: dict[str, Any]) -> dict[str, Any]:
    """Tier 2 as an op x dtype table of statuses (conversions: source->target in the cell; a
    case of no dtype, such as `ops/MMA/none` where a device declares no matrix unit, under
    a "-" column)."""
    columns = [d.name for d in dtypes.ALL]
    rows: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for c in data["cases"]:
        if c["tier"] != 2:
            continue
        source, _, target = (c["dtype"] or "-").partition("->")
        if source not in columns:
            columns.append(source)
        cell = rows.setdefault(c["op"], {}).setdefault(source, [])
        cell.append((target or source, c["status"]))
    return {"columns": columns, "rows": rows}


def blocked_by_cause(data: dict[str, Any]) -> dict[str, list[str]]:
    """Blocked case ids under the first case that blocked each (its id and status): one broken
    part is one heading, however many cases it held up."""
    causes: dict[str, list[str]] = {}
    for c in data["cases"]:
        if c["status"] == "blocked":
            first = c["message"].removeprefix("blocked by ").split(", ")[0]
            causes.setdefault(first, []).append(c["id"])
    return dict(sorted(causes.items(), key=lambda item: -len(item[1])))


def perf_bars(perf: list[dict[str, Any]], width: float = 400.0) -> dict[str, Any]:
    """Where each perf ratio sits on a log scale (ratios spanning 1000x stay readable), with
    the spread of its repeats (the reference's median over the slowest and fastest repeat),
    and where 1x (as fast as the CPU reference) is: {"bars": [{x, low_x, high_x, ...}]}."""
    def spread(p: dict[str, Any]) -> tuple[float, float] | None:
        if not p.get("ratio") or not p.get("min_seconds") or not p.get("max_seconds"):
            return None
        return p["reference_seconds"] / p["max_seconds"], p["reference_seconds"] / p["min_seconds"]

    ratios = [p["ratio"] for p in perf if p.get("ratio")]
    ratios += [r for p in perf if (s := spread(p)) for r in s]
    low = math.log10(min(ratios + [1.0])) - 0.1
    high = math.log10(max(ratios + [1.0])) + 0.1

    def x(ratio: float) -> float:
        return round(width * (math.log10(ratio) - low) / (high - low), 1)

    return {"bars": [{**p, "x": x(p["ratio"]) if p.get("ratio") else None,
                      "spread_x": tuple(map(x, s)) if (s := spread(p)) else None}
                     for p in perf],
            "one": x(1.0), "low": 10 ** low, "high": 10 ** high}


def anchor(case_id: str) -> str:
    """The HTML id of a case's evidence in the report: `case-` and the case id, each run of
    characters other than letters, digits, `.` and `-` written `_`."""
    return "case-" + re.sub(r"[^A-Za-z0-9.-]+", "_", case_id)


def tier_summary(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Per tier of a JSON report: number, name, status, reason, its count of each status, and
    the cases with evidence (failed, xfail, xpass, crashed, timeout) that the page links to."""
    evidence = {s.value for s in EVIDENCE}
    rows = []
    for name, tier in data["tiers"].items():
        cases = [c for c in data["cases"] if c["tier"] == tier["tier"]]
        counts = {s.value: sum(c["status"] == s.value for c in cases) for s in Status}
        rows.append({"tier": tier["tier"], "name": name, "status": tier["status"],
                     "reason": tier.get("reason", ""), "counts": counts,
                     "failing": [c["id"] for c in cases if c["status"] in evidence]})
    return rows


def counts_line(data: dict[str, Any]) -> str:
    """The verdict's one line: each status that occurred with its count, the total, and how
    many tiers did not run."""
    summary = data["summary"]
    counts = ", ".join(f"{summary[s.value]} {s.value}" for s in Status if summary[s.value])
    not_run = len(summary["not_run"])
    tail = f"; {not_run} tier{'s' * (not_run != 1)} not run" if not_run else ""
    return f"{counts or 'no cases'} of {summary['total']}{tail}"


def write_html(report: Report | dict[str, Any], path: str | Path) -> None:
    """Writes one self-contained HTML page. Its first screen: a verdict banner, the counts per
    tier (linked to each tier and failing case below) and the perf chart; then the failures
    with their evidence, blocked cases by cause, each tier's cases, capabilities."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("portkit.conformance", "templates"),
                             autoescape=True)
    env.filters["anchor"] = anchor
    data = _document(report)
    by_tier = {}
    for name, tier in data["tiers"].items():
        by_tier[name] = [c for c in data["cases"] if c["tier"] == tier["tier"]]
    tiers = tier_summary(data)
    shown = [s.value for s in Status if s.value in ("passed", "failed", "blocked")
             or any(t["counts"][s.value] for t in tiers)]
    linked = {s.value for s in EVIDENCE}
    html = env.get_template("report.html.j2").render(
        report=data, grid=grid(data), perf=perf_bars(data["perf"]), styles=_STYLE,
        by_tier=by_tier, blocked=blocked_by_cause(data), tiers=tiers, shown=shown,
        counts_line=counts_line(data), linked=linked,
        evidence=[c for c in data["cases"] if c["status"] in linked])
    Path(path).write_text(html)


def tier_counts(report: Report) -> dict[str, dict[str, int]]:
    """Per tier name, how many of its results have each status (every status, zeros too)."""
    counts = {name: {s.value: 0 for s in Status} for name in report.tiers}
    number = {tier["tier"]: name for name, tier in report.tiers.items()}
    for r in report.results:
        if r.case.tier in number:
            counts[number[r.case.tier]][r.status.value] += 1
    return counts


def tier_table(report: Report) -> Table:
    """The per-tier summary, narrow enough for 80 columns: passed, failed and blocked always,
    another status only when some tier has it, no status column (a tier not run shows "-"
    and is explained below the table), and collapsed padding."""
    counts = tier_counts(report)
    shown = [s.value for s in Status if s.value in ("passed", "failed", "blocked")
             or any(c[s.value] for c in counts.values())]
    title = f"portkit conform --backend {report.backend}  ({report.seconds:.1f} s)"
    table = Table("tier", *[Column(s, justify="right", no_wrap=True) for s in shown],
                  title=title, min_width=min(len(title), 80), box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for name, tier in report.tiers.items():
        ran = tier["status"] == "run"
        table.add_row(f"{tier['tier']} {name}", *[
            ("-" if not ran else f"[{_STYLE[k]}]{counts[name][k]}[/]" if counts[name][k]
             else "0") for k in shown])
    return table


def perf_table(perf: list[dict[str, Any]]) -> Table:
    """The perf figures, narrow enough for 80 columns (their warnings are printed below)."""
    table = Table("benchmark", "figure", "seconds", "CPU s", "ratio", "of peak",
                  title="performance (median)", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for p in perf:
        table.add_row(p["name"], f"{p['value']:.4g} {p['unit']}", f"{p['seconds']:.3g}",
                      _fmt(p["reference_seconds"]), _fmt(p["ratio"], "{:.2f}x"),
                      _fmt(p["peak_fraction"], "{:.0%}"))
    for column in table.columns:
        column.no_wrap = True
    return table


def print_terminal(report: Report, console: Console | None = None) -> None:
    """Prints the summary per tier, every case that did not pass, and the perf figures."""
    console = console or Console()
    console.print(tier_table(report))
    for name, tier in report.tiers.items():
        if tier["status"] != "run":
            console.print(f"[yellow]tier {tier['tier']} ({name}) not run:[/] "
                          f"{escape(tier['reason'])}")
    shown = [r for r in report.results
             if r.status not in (Status.PASSED, Status.UNSUPPORTED, Status.BLOCKED)]
    blocked = blocked_by_cause({"cases": [{"id": r.case.id, "status": r.status.value,
                                           "message": r.message} for r in report.results]})
    if blocked:     # one row per broken part, however many cases it held up
        table = Table("blocked by", "cases", "for example", title="blocked")
        for cause, ids in blocked.items():
            more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
            table.add_row(Text(cause), str(len(ids)), Text(", ".join(ids[:3]) + more))
        console.print(table)
    if shown:
        table = Table("case", "status", "message", title="not passed", show_lines=True)
        for r in shown[:200]:
            # Text: a message's brackets (arrays, `pip install 'x[extra]'`) are not markup.
            table.add_row(Text(r.case.id), Text(r.status.value, style=_STYLE[r.status.value]),
                          Text(r.message))
        console.print(table)
        if len(shown) > 200:
            console.print(f"... and {len(shown) - 200} more (see --json or --html)")
        replays = [r.replay for r in shown if r.replay]
        if replays:
            console.print("reproduce each failure with:")
            for line in replays:     # one unwrapped line each, to copy and paste
                console.print(f"  {line}", soft_wrap=True, highlight=False, markup=False)
    perf = [r.perf for r in report.results if r.perf]
    if perf:
        console.print(perf_table(perf))
        for p in perf:     # below the table, whole: a column of them wraps into a tower
            if p["warning"]:
                console.print(Text(f"{p['name']}: {p['warning']}", style="yellow"))
    counts = ", ".join(f"{v} {k}" for k, v in report.counts().items() if v)
    verdict = "[green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(f"{verdict}: {counts or 'no cases'}")


def _fmt(value: float | None, pattern: str = "{:.3g}") -> str:
    return "-" if value is None else pattern.format(value)
