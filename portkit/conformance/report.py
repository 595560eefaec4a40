"""Reports of a conformance run: JSON (versioned schema), JUnit XML, one-file HTML, terminal.

JSON schema, version 1 (fields are only ever added within a version):
    schema_version, backend, abi_version, portkit_version, device, capabilities, options,
    seconds, ok, summary {<status>: count for every status, total, not_run {tier: reason}},
    tiers {name: {tier, status, reason, cases}},
    cases [{id, tier, op, dtype, status, max_ulp, max_error, message, seconds, worst, replay,
            repro_path, kernel (ABI JSON, failures only), source (failures only)}],
    perf [{name, seconds, reference_seconds, ratio, value, unit, peak_fraction, warning}]
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jinja2
from rich.console import Console
from rich.table import Table

import portkit
from portkit.abi import ABI_VERSION, dtypes
from portkit.conformance.case import Status
from portkit.conformance.suite import Report

SCHEMA_VERSION = 2   # 2: capabilities lost fixed_block (ABI 0.2)
_EVIDENCE = (Status.FAILED, Status.XFAIL, Status.XPASS)
_STYLE = {"passed": "green", "failed": "bold red", "blocked": "yellow", "unsupported": "dim",
          "xfail": "magenta", "xpass": "bold magenta"}


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


def to_dict(report: Report) -> dict[str, Any]:
    """The run as the versioned JSON document described in this module's docstring."""
    summary: dict[str, Any] = report.counts()
    summary["total"] = len(report.results)
    summary["not_run"] = {name: t["reason"] for name, t in report.tiers.items()
                          if t["status"] != "run"}
    cases = []
    for r in report.results:
        evidence = r.status in _EVIDENCE
        cases.append({
            "id": r.case.id, "tier": r.case.tier, "op": r.case.op, "dtype": r.case.dtype,
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
                    "perf_min_ratio": options.perf_min_ratio},
        "seconds": round(report.seconds, 3), "ok": report.ok, "summary": summary,
        "tiers": report.tiers, "cases": cases,
        "perf": [r.perf for r in report.results if r.perf],
    }


def write_json(report: Report, path: str | Path) -> None:
    """Writes the JSON report."""
    Path(path).write_text(json.dumps(to_dict(report), indent=1, default=_jsonable))


def _jsonable(value: Any) -> Any:
    return float(value) if hasattr(value, "__float__") else str(value)


def write_junit(report: Report, path: str | Path) -> None:
    """Writes JUnit XML: a testsuite per tier; blocked, unsupported and xfail are skips."""
    root = ET.Element("testsuites", name=f"portkit conform {report.backend}")
    for name, tier in report.tiers.items():
        results = [r for r in report.results if r.case.tier == tier["tier"]]
        suite = ET.SubElement(root, "testsuite", name=f"{report.backend}.{name}",
                              tests=str(max(len(results), 1)))
        if tier["status"] != "run":
            case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name=name)
            ET.SubElement(case, "skipped", message=f"not run: {tier['reason']}")
            continue
        failures = 0
        for r in results:
            case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name=r.case.id,
                                 time=f"{r.seconds:.6f}")
            if r.status in (Status.FAILED, Status.XPASS):
                failures += 1
                failure = ET.SubElement(case, "failure", message=r.message[:500])
                failure.text = "\n".join(filter(None, [r.message, r.replay, r.source]))
            elif r.status is not Status.PASSED:
                ET.SubElement(case, "skipped", message=f"{r.status.value}: {r.message}"[:500])
        suite.set("failures", str(failures))
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def grid(report: Report) -> dict[str, Any]:
    """Tier 2 as an op x dtype table of statuses (conversions: source->target in the cell)."""
    columns = [d.name for d in dtypes.ALL]
    rows: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for r in report.results:
        if r.case.tier != 2:
            continue
        source, _, target = r.case.dtype.partition("->")
        cell = rows.setdefault(r.case.op, {}).setdefault(source, [])
        cell.append((target or r.case.dtype, r.status.value))
    return {"columns": columns, "rows": rows}


def write_html(report: Report, path: str | Path) -> None:
    """Writes a single self-contained HTML page: summary, op x dtype grid, failures, perf."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("portkit.conformance", "templates"),
                             autoescape=True)
    data = to_dict(report)
    perf = data["perf"]
    scale = max([p["ratio"] or 0 for p in perf] + [1.0])
    html = env.get_template("report.html.j2").render(
        report=data, grid=grid(report), perf_scale=scale, styles=_STYLE,
        evidence=[c for c in data["cases"] if c["status"] in ("failed", "xfail", "xpass")])
    Path(path).write_text(html)


def print_terminal(report: Report, console: Console | None = None) -> None:
    """Prints the summary per tier, every case that did not pass, and the perf figures."""
    console = console or Console()
    tiers = Table("tier", "status", *[s.value for s in Status], title=(
        f"portkit conform --backend {report.backend}  ({report.seconds:.1f} s)"))
    for name, tier in report.tiers.items():
        counts = {s.value: 0 for s in Status}
        for r in report.results:
            if r.case.tier == tier["tier"]:
                counts[r.status.value] += 1
        tiers.add_row(f"{tier['tier']} {name}", "ran" if tier["status"] == "run" else "NOT RUN", *[
            f"[{_STYLE[k]}]{v}[/]" if v else "0" for k, v in counts.items()])
    console.print(tiers)
    for name, tier in report.tiers.items():
        if tier["status"] != "run":
            console.print(f"[yellow]tier {tier['tier']} ({name}) not run:[/] {tier['reason']}")
    shown = [r for r in report.results if r.status not in (Status.PASSED, Status.UNSUPPORTED)]
    if shown:
        table = Table("case", "status", "message", title="not passed", show_lines=True)
        for r in shown[:200]:
            table.add_row(r.case.id, f"[{_STYLE[r.status.value]}]{r.status.value}[/]",
                          r.message)
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
        table = Table("benchmark", "figure", "seconds", "CPU ref. s", "ratio", "of peak",
                      "warning", title="performance (median)")
        for p in perf:
            table.add_row(p["name"], f"{p['value']:.4g} {p['unit']}", f"{p['seconds']:.3g}",
                          _fmt(p["reference_seconds"]), _fmt(p["ratio"], "{:.2f}x"),
                          _fmt(p["peak_fraction"], "{:.0%}"), p["warning"] or "")
        console.print(table)
    counts = ", ".join(f"{v} {k}" for k, v in report.counts().items() if v)
    verdict = "[green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(f"{verdict}: {counts or 'no cases'}")


def _fmt(value: float | None, pattern: str = "{:.3g}") -> str:
    return "-" if value is None else pattern.format(value)
