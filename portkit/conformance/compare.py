"""Between runs: merge the JSON reports of shards (or boards) into one, and diff two nights.

Both work on the JSON documents of portkit.conformance.report, so a merged report is written
as HTML or JUnit exactly like a run's, and a diff needs nothing but two files.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portkit.abi import PortkitError
from portkit.conformance.case import FAILING as FAILING_STATUSES
from portkit.conformance.case import Status
from portkit.conformance.report import READABLE_VERSIONS, SCHEMA_VERSION

# Statuses that make a run fail (the exit code's rule, as Report.ok).
FAILING = tuple(status.value for status in FAILING_STATUSES)
# Options that must agree for reports to be one run's slices; the shard is what differs.
_SAME_RUN = ("tiers", "pattern", "dtypes", "quick", "seed", "xfail_file", "perf_min_ratio")


class ReportError(PortkitError):
    """Reports that cannot be read, merged or compared; the message says which and why."""


def load(path: str | Path) -> dict[str, Any]:
    """A JSON report of `portkit conform --json`; ReportError unless it is one of this
    schema version."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ReportError(f"cannot read report {path}: {error}") from None
    if not isinstance(data, dict) or data.get("schema_version") not in READABLE_VERSIONS:
        found = data.get("schema_version") if isinstance(data, dict) else None
        versions = " or ".join(map(str, READABLE_VERSIONS))
        raise ReportError(f"{path}: not a JSON report of schema version {versions} "
                          f"(found {found!r}); write it with this portkit's "
                          "`portkit conform --json`")
    return data


def merge(documents: list[dict[str, Any]], sources: list[str]) -> dict[str, Any]:
    """One report from the reports of a run's shards (in any order): the cases in the whole
    run's order, counts and verdict recomputed. ReportError when they are not one run's
    (another backend, other options) or when two hold the same case."""
    first, where = documents[0], sources[0]
    seen: dict[str, str] = {}
    for data, source in zip(documents, sources):
        if data["backend"] != first["backend"]:
            raise ReportError(f"{source} is backend {data['backend']!r}, {where} is "
                              f"{first['backend']!r}: merge the reports of one backend")
        differ = [k for k in _SAME_RUN if data["options"].get(k) != first["options"].get(k)]
        if differ:
            raise ReportError(f"{source} and {where} differ in {', '.join(differ)}: merge "
                              "shards of one run (the same options but --shard)")
        for case in data["cases"]:
            if case["id"] in seen:
                raise ReportError(f"case {case['id']} is in both {seen[case['id']]} and "
                                  f"{source}: merge distinct shards (--shard I/N, I = 1..N)")
            seen[case["id"]] = source
    cases = sorted((c for d in documents for c in d["cases"]),
                   key=lambda c: (c["index"] is None, c["index"] or 0))
    place = {c["id"]: n for n, c in enumerate(cases)}
    tiers: dict[str, dict[str, Any]] = {}
    for data in documents:
        for name, tier in data["tiers"].items():
            merged = tiers.setdefault(name, {**tier, "cases": 0} if tier["status"] == "run"
                                      else dict(tier))
            if tier["status"] == "run":
                merged.update(status="run", reason="")
                merged["cases"] = merged.get("cases", 0) + tier["cases"]
    devices = list(dict.fromkeys(d["device"] for d in documents))
    result = {**first, "schema_version": SCHEMA_VERSION, "device": ", ".join(devices),
              "options": {**first["options"], "shard": None},
              "started": min(d.get("started", "") for d in documents),
              "seconds": max(d["seconds"] for d in documents),
              "tiers": dict(sorted(tiers.items(), key=lambda item: item[1]["tier"])),
              "cases": cases,
              "perf": sorted((p for d in documents for p in d["perf"]),
                             key=lambda p: place.get(p.get("case"), len(place)))}
    result["summary"] = summary(result)
    result["ok"] = not any(c["status"] in FAILING for c in cases)
    return result


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """The report's summary from its cases and tiers: a count per status, total, not_run."""
    counts: dict[str, Any] = {status.value: 0 for status in Status}
    for case in data["cases"]:
        counts[case["status"]] += 1
    counts["total"] = len(data["cases"])
    counts["not_run"] = {name: t["reason"] for name, t in data["tiers"].items()
                         if t["status"] != "run"}
    return counts


@dataclass
class Diff:
    """What changed from an old run to a new one."""

    new_failures: list[dict[str, Any]] = field(default_factory=list)   # {id, old, new, message}
    fixes: list[dict[str, Any]] = field(default_factory=list)          # {id, old, new}
    slower: list[dict[str, Any]] = field(default_factory=list)  # {name, old, new, change}
    faster: list[dict[str, Any]] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)       # cases the new run does not have
    added: list[str] = field(default_factory=list)      # cases only the new run has
    noise: float = 0.25

    @property
    def regressed(self) -> bool:
        """True when a case newly fails or a benchmark got slower beyond the noise."""
        return bool(self.new_failures or self.slower)


def diff(old: dict[str, Any], new: dict[str, Any], noise: float = 0.25) -> Diff:
    """New failures, fixes, and benchmarks whose median time moved by more than `noise` (a
    fraction: 0.25 means 25% slower or faster) from `old` to `new`."""
    found = Diff(noise=noise)
    before = {c["id"]: c for c in old["cases"]}
    after = {c["id"]: c for c in new["cases"]}
    for case_id, case in after.items():
        was = before.get(case_id)
        if was is None:
            found.added.append(case_id)
        elif case["status"] in FAILING and was["status"] not in FAILING:
            found.new_failures.append({"id": case_id, "old": was["status"],
                                       "new": case["status"], "message": case["message"]})
        elif was["status"] in FAILING and case["status"] not in FAILING:
            found.fixes.append({"id": case_id, "old": was["status"], "new": case["status"]})
    found.gone = [case_id for case_id in before if case_id not in after]
    timed = {p["name"]: p for p in old["perf"] if p.get("seconds")}
    for p in new["perf"]:
        was = timed.get(p["name"])
        if not was or not p.get("seconds"):
            continue
        change = p["seconds"] / was["seconds"] - 1
        move = {"name": p["name"], "old": was["seconds"], "new": p["seconds"],
                "change": change}
        if change > noise:
            found.slower.append(move)
        elif change < -noise / (1 + noise):     # as far below as `noise` is above
            found.faster.append(move)
    return found


def print_diff(found: Diff, console: Any) -> None:
    """Prints a diff for a terminal (a rich Console): each list under its heading."""
    from rich.markup import escape

    def section(title: str, lines: list[str], style: str) -> None:
        if lines:
            console.print(f"[{style}]{title} ({len(lines)})[/]")
            for line in lines:
                console.print(f"  {escape(line)}", highlight=False)

    section("new failures", [f"{d['id']}: {d['old']} -> {d['new']}: {d['message']}"
                             for d in found.new_failures], "bold red")
    section(f"slower beyond the noise ({found.noise:.0%})", [
        f"{p['name']}: {p['old']:.3g} s -> {p['new']:.3g} s ({p['change']:+.0%})"
        for p in found.slower], "bold red")
    section("fixed", [f"{d['id']}: {d['old']} -> {d['new']}" for d in found.fixes], "green")
    section("faster", [f"{p['name']}: {p['old']:.3g} s -> {p['new']:.3g} s "
                       f"({p['change']:+.0%})" for p in found.faster], "green")
    section("only in the old run", found.gone, "yellow")
    section("only in the new run", found.added, "yellow")
    console.print("[bold red]REGRESSED[/]" if found.regressed else
                  "[green]no regression[/]")


def write_diff_html(found: Diff, old: dict[str, Any], new: dict[str, Any],
                    path: str | Path) -> None:
    """Writes the diff as one self-contained HTML page."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("portkit.conformance", "templates"),
                             autoescape=True)
    Path(path).write_text(env.get_template("diff.html.j2").render(diff=found, old=old, new=new))
