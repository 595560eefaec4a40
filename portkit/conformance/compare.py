"""Between runs: merge the JSON reports of shards (or boards) into one, and diff two nights.

Both work on the JSON documents of portkit.conformance.report, so a merged report is written
as HTML or JUnit exactly like a run's, and a diff needs nothing but two files.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from portkit.abi import PortkitError
from portkit.conformance.case import BLOCKING as BLOCKING_STATUSES
from portkit.conformance.case import FAILING as FAILING_STATUSES
from portkit.conformance.case import Status
from portkit.conformance.report import READABLE_VERSIONS, SCHEMA_VERSION

# Statuses that make a run fail (the exit code's rule, as Report.ok).
FAILING = tuple(status.value for status in FAILING_STATUSES)
_BLOCKING = tuple(status.value for status in BLOCKING_STATUSES)
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
    # passed, now blocked by a case that did not block in the old run: a regression
    newly_blocked: list[dict[str, Any]] = field(default_factory=list)  # {id, old, new, message}
    # passed, now blocked by a known failure, or unsupported: listed, not a regression
    not_run: list[dict[str, Any]] = field(default_factory=list)        # {id, old, new, message}
    slower: list[dict[str, Any]] = field(default_factory=list)  # {name, old, new, change}
    faster: list[dict[str, Any]] = field(default_factory=list)
    noisy: list[dict[str, Any]] = field(default_factory=list)   # moves {.., why} excused
    gone: list[str] = field(default_factory=list)       # cases the new run does not have
    added: list[str] = field(default_factory=list)      # cases only the new run has
    noise: float = 0.25

    @property
    def regressed(self) -> bool:
        """True when a case newly fails, is newly blocked by a new upstream failure, or a
        benchmark got slower beyond the noise and beyond both runs' own spread."""
        return bool(self.new_failures or self.newly_blocked or self.slower)


# "blocked by ops/SIN/float32 (failed), ops/EXP2/float32 (xfail) and 4 more"
_BLOCKER = re.compile(r"(\S+) \((\w+)\)")


def blockers(message: str) -> list[str]:
    """The case ids a blocked case's message names as its blockers (at most three)."""
    return [case_id for case_id, _ in _BLOCKER.findall(message.removeprefix("blocked by "))]


def diff(old: dict[str, Any], new: dict[str, Any], noise: float = 0.25) -> Diff:
    """New failures, fixes, cases that passed and now do not run, and benchmarks whose median
    time moved by more than `noise` (a fraction: 0.25 means 25% slower or faster) from `old`
    to `new`. A move within either run's spread of repeats, or of a figure either run marks
    noisy, goes to `noisy`, not `slower` or `faster`."""
    found = Diff(noise=noise)
    before = {c["id"]: c for c in old["cases"]}
    after = {c["id"]: c for c in new["cases"]}
    for case_id, case in after.items():
        was = before.get(case_id)
        if was is None:
            found.added.append(case_id)
            continue
        change = {"id": case_id, "old": was["status"], "new": case["status"],
                  "message": case["message"]}
        if case["status"] in FAILING and was["status"] not in FAILING:
            found.new_failures.append(change)
        elif was["status"] in FAILING and case["status"] not in FAILING:
            found.fixes.append(change)
        elif was["status"] == "passed" and case["status"] == "blocked":
            # It passed, so its prerequisites passed then; unless each blocker named was
            # already failing in the old run (a prerequisite added since), the failure is new.
            known = all(before.get(b, {}).get("status") in _BLOCKING
                        for b in blockers(case["message"]))
            (found.not_run if known else found.newly_blocked).append(change)
        elif was["status"] == "passed" and case["status"] == "unsupported":
            found.not_run.append(change)
    found.gone = [case_id for case_id in before if case_id not in after]
    timed = {p["name"]: p for p in old["perf"] if p.get("seconds")}
    for p in new["perf"]:
        was = timed.get(p["name"])
        if not was or not p.get("seconds"):
            continue
        change = p["seconds"] / was["seconds"] - 1
        move = {"name": p["name"], "old": was["seconds"], "new": p["seconds"],
                "change": change}
        if not (change > noise or change < -noise / (1 + noise)):   # as far below as above
            continue
        why = _excuse(was, p)
        if why:
            found.noisy.append({**move, "why": why})
        else:
            (found.slower if change > 0 else found.faster).append(move)
    return found


def _excuse(old: dict[str, Any], new: dict[str, Any]) -> str:
    """Why a move of a benchmark's median from `old` to `new` may be noise ("" if it is not):
    either run marks it noisy, or either median lies within the other run's repeats."""
    marked = [name for name, p in (("old", old), ("new", new)) if p.get("noisy")]
    if marked:
        return f"marked noisy in the {' and '.join(marked)} run"
    for name, p, median in (("old", old, new["seconds"]), ("new", new, old["seconds"])):
        if p.get("min_seconds") is not None and p.get("max_seconds") is not None and \
                p["min_seconds"] <= median <= p["max_seconds"]:
            return f"within the {name} run's repeats ({p['min_seconds']:.3g}-" \
                   f"{p['max_seconds']:.3g} s)"
    return ""


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
    section("passed, now blocked by a new upstream failure", [
        f"{d['id']}: {d['message']}" for d in found.newly_blocked], "bold red")
    section("passed, now not run (blocked by a known failure, or unsupported)", [
        f"{d['id']}: {d['new']}: {d['message']}" for d in found.not_run], "yellow")
    section("fixed", [f"{d['id']}: {d['old']} -> {d['new']}" for d in found.fixes], "green")
    section("faster", [f"{p['name']}: {p['old']:.3g} s -> {p['new']:.3g} s "
                       f"({p['change']:+.0%})" for p in found.faster], "green")
    section("moved, but within the noise of a run (not a regression)", [
        f"{p['name']}: {p['old']:.3g} s -> {p['new']:.3g} s ({p['change']:+.0%}): {p['why']}"
        for p in found.noisy], "dim")
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
