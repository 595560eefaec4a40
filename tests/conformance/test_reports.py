"""Reports and options: the JSON schema, JUnit XML, the HTML page, filters, xfail files, perf."""
import importlib
import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from portkit import cli
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.conformance import Options, Status, Target, generate, report, run, suite, tier5_models
from portkit.conformance.case import TierNotRun


@pytest.fixture(scope="module")
def broken_report(tmp_path_factory):
    """A quick run of tiers 1-2 and 4-6 on a SIN-broken interpreter, with tier 6 on its own and
    tier 5 made to report itself not run (as a tier does when the stack it needs is missing)."""
    def not_run(ctx):
        raise TierNotRun("needs portkit.nn, which does not import here (test)")

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parent))
        broken = importlib.import_module("broken_backends")
        patch.setattr(tier5_models, "cases", not_run)
        options = Options(tiers=(1, 2, 4, 5, 6), quick=True, reference="interpreter",
                          repro_dir=str(tmp_path_factory.mktemp("repro")))
        return run(Target(broken.sin_off()), options)


def test_json_report_has_the_versioned_schema(broken_report, tmp_path):
    path = tmp_path / "r.json"
    report.write_json(broken_report, path)
    data = json.loads(path.read_text())
    for key in ("schema_version", "backend", "abi_version", "portkit_version", "device",
                "capabilities", "summary", "cases", "perf", "tiers"):
        assert key in data
    assert data["schema_version"] == 3 and data["backend"] == "broken-sin"
    assert data["summary"]["failed"] >= 1 and data["summary"]["total"] == len(data["cases"])
    assert set(data["summary"]["not_run"]) == {"models"}
    assert data["tiers"]["models"]["status"] == "not run"
    assert data["tiers"]["tensor"]["status"] == "run"
    [sin] = [c for c in data["cases"] if c["id"] == "ops/SIN/float32"]
    assert sin["status"] == "failed" and sin["max_ulp"] > 4 and sin["kernel"]["nodes"]
    assert sin["replay"].startswith("portkit replay ") and sin["source"]
    for case in data["cases"]:
        assert {"id", "tier", "op", "dtype", "status", "max_ulp", "max_error",
                "message"} <= set(case)
    names = {p["name"] for p in data["perf"]}
    assert names == {"copy", "fused-elementwise", "reduce", "matmul-handwritten", "matmul-codegen", "conv",
                     "launch-latency", "launch-latency-batched", "compile-time"}
    for p in data["perf"]:
        assert p["seconds"] > 0 and p["reference_seconds"] > 0 and p["ratio"] > 0
        assert 0 < p["min_seconds"] <= p["seconds"] <= p["max_seconds"]


def test_junit_counts_failures_and_skips_what_did_not_run(broken_report, tmp_path):
    path = tmp_path / "r.xml"
    report.write_junit(broken_report, path)
    root = ET.parse(path).getroot()
    suites = {s.get("name"): s for s in root}
    assert int(suites["broken-sin.ops"].get("failures")) == broken_report.counts()["failed"]
    assert suites["broken-sin.models"].find("testcase/skipped") is not None
    failure = root.find(".//testcase[@name='ops/SIN/float32']/failure")
    assert "ULP" in failure.get("message") and "portkit replay" in failure.text


def test_html_report_is_one_file_with_grid_failures_and_a_perf_plot(broken_report, tmp_path):
    path = tmp_path / "r.html"
    report.write_html(broken_report, path)
    html = path.read_text()
    assert "<svg" in html and "http" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "ops/SIN/float32" in html and "portkit replay" in html
    assert 'class="failed">failed</td>' in html and "not run" in html
    # Each benchmark's spread: a whisker from its slowest to its fastest repeat.
    assert html.count('<line class="spread"') == len(report.to_dict(broken_report)["perf"]) > 0


class _Page(HTMLParser):
    """The ids of a page in document order, its #links, and the tier table's rows of cells."""

    def __init__(self, html: str):
        super().__init__()
        self.ids, self.links, self.rows, self.table = [], [], [], None
        self.banner, self.in_banner, self.cell = "", False, None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.append(attrs["id"])
            self.table = attrs["id"] if tag == "table" else self.table
            self.in_banner = attrs["id"] == "verdict"
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])
        if self.table == "tiers" and tag == "tr":
            self.rows.append([])
        if self.table == "tiers" and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self.table = None
        if tag == "div":
            self.in_banner = False
        if self.table == "tiers" and tag in ("td", "th"):
            self.rows[-1].append(" ".join(self.cell.split()))
            self.cell = None

    def handle_data(self, data):
        if self.in_banner:
            self.banner += data
        if self.cell is not None:
            self.cell += data


def test_html_first_screen_is_verdict_tier_counts_and_perf_with_links(broken_report,
                                                                       tmp_path):
    report.write_html(broken_report, tmp_path / "r.html")
    page = _Page((tmp_path / "r.html").read_text())
    data = report.to_dict(broken_report)
    place = {name: page.ids.index(name) for name in ("verdict", "tiers", "perf", "failures")}
    assert place["verdict"] < place["tiers"] < place["perf"] < place["failures"]
    assert all(page.ids.index(f"tier-{t['tier']}") > place["failures"]
               for t in data["tiers"].values())
    banner = " ".join(page.banner.split())
    counts = broken_report.counts()
    assert banner.startswith("FAILED ") and f"{counts['failed']} failed" in banner
    assert f"{counts['passed']} passed" in banner and "1 tier not run" in banner
    header, *rows = page.rows
    assert header[:4] == ["tier", "passed", "failed", "blocked"]
    by_tier = report.tier_counts(broken_report)
    for row in rows:
        name = row[0].split()[1]
        if data["tiers"][name]["status"] == "run":
            assert row[1:4] == [str(by_tier[name][s]) for s in ("passed", "failed", "blocked")]
        else:
            assert row[1].startswith("not run: needs portkit.nn")
    failing = [c["id"] for c in data["cases"] if c["status"] == "failed"]
    assert failing and all(report.anchor(i) in page.ids for i in failing)
    assert report.anchor("ops/SIN/float32") in page.links      # linked from the tier table
    assert {f"tier-{t['tier']}" for t in data["tiers"].values()} <= set(page.links)
    assert set(page.links) <= set(page.ids) and len(page.ids) == len(set(page.ids))


def test_terminal_summary_names_failures_and_replays(broken_report):
    console = Console(record=True, width=200)
    report.print_terminal(broken_report, console)
    text = console.export_text()
    assert "ops/SIN/float32" in text and "FAILED" in text
    assert "tier 5 (models) not run" in text and "performance (median)" in text
    assert "  portkit replay " in text


def _header_and_rows(table, width: int = 80) -> list[str]:
    console = Console(width=width, record=True)
    console.print(table)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_tier_table_fits_80_columns_with_whole_headers(broken_report):
    lines = _header_and_rows(report.tier_table(broken_report))
    assert max(map(len, lines)) <= 80 and "…" not in "".join(lines)
    [header] = [line for line in lines if line.split()[:1] == ["tier"]]
    # no status column, and another status only where a tier has it (ops/MMA/none is
    # unsupported on a device that declares no matrix unit)
    assert header.split() == ["tier", "passed", "failed", "blocked", "unsupported"]
    assert lines[0].strip() == f"portkit conform --backend broken-sin  ({broken_report.seconds:.1f} s)"
    [models] = [line for line in lines if "5 models" in line]
    assert models.split()[2:] == ["-"] * 4        # not run: explained below the table
    counts = report.tier_counts(broken_report)["ops"]
    [ops] = [line for line in lines if "2 ops" in line]
    assert ops.split()[2:] == [str(counts[s]) for s in ("passed", "failed", "blocked", "unsupported")]


def test_perf_table_fits_80_columns_and_warnings_print_whole_below_it(broken_report):
    perf = [r.perf for r in broken_report.results if r.perf]
    lines = _header_and_rows(report.perf_table(perf))
    assert max(map(len, lines)) <= 80 and "…" not in "".join(lines)
    assert ["benchmark", "figure", "seconds", "CPU", "s", "ratio", "of", "peak"] in [
        line.split() for line in lines]
    console = Console(width=80, record=True)
    report.print_terminal(broken_report, console)
    text = console.export_text()
    warned = [p for p in perf if p["warning"]]
    assert warned and all(" ".join(f"{p['name']}: {p['warning']}".split()) in
                          " ".join(text.split()) for p in warned)


def test_tier_table_with_every_status_still_fits_80_columns():
    from portkit.conformance.case import Case, Result

    results = [Result(Case(f"tensor/{s.value}/{n}", 4), s) for s in Status for n in range(1234)]
    run_ = suite.Report("opencl", None, Options(), results, seconds=1234.5, tiers={
        "runtime": {"tier": 1, "status": "run"}, "tensor": {"tier": 4, "status": "run"}})
    lines = _header_and_rows(report.tier_table(run_))
    assert max(map(len, lines)) <= 80 and "…" not in "".join(lines)
    assert [w for line in lines if line.split()[:1] == ["tier"] for w in line.split()] == [
        "tier", *[s.value for s in Status]]
    assert "4 tensor" + "1234".rjust(len("passed") + 2) in "\n".join(lines)


def test_terminal_shows_blocked_cases_once_per_cause(broken, tmp_path):
    # copyout drops a byte: the round trips fail, and every case above them is blocked.
    run_ = run(Target(broken.copyout_short()), Options(tiers=(1, 2), quick=True,
                                                       repro_dir=str(tmp_path)))
    console = Console(record=True, width=200)
    report.print_terminal(run_, console)
    lines = console.export_text().splitlines()
    blocked = [r for r in run_.results if r.status is Status.BLOCKED]
    assert len(blocked) > 200
    assert not any(r.case.id in line for r in blocked[3:] for line in lines)
    causes = report.blocked_by_cause(report.to_dict(run_))
    for cause, ids in causes.items():
        [row] = [line for line in lines if line.startswith(f"│ {cause} ")]
        assert f"│ {len(ids)} " in row and f"and {len(ids) - 3} more" in row


def test_perf_min_ratio_turns_slowness_into_a_failure(tmp_path):
    interp = Target.load("interpreter")
    # The interpreter against the CPU reference is far slower; without the option, a warning.
    options = Options(tiers=(6,), quick=True, pattern="perf/copy", reference="cpu")
    [warned] = run(interp, options).results
    assert warned.status is Status.PASSED and "warning" in warned.message
    options.perf_min_ratio = 0.9
    [failed] = run(interp, options).results
    assert failed.status is Status.FAILED and "--perf-min-ratio 0.9" in failed.message


def test_filters_select_by_pattern_glob_dtype_and_tier():
    interp = Target.load("interpreter")
    ids = [r.case.id for r in run(interp, Options(tiers=(2,), quick=True, pattern="MAX")).results]
    assert ids and all("MAX" in i for i in ids)
    ids = [r.case.id for r in run(interp, Options(tiers=(2,), quick=True,
                                                  pattern="ops/*/int8")).results]
    assert ids and all(i.endswith("/int8") for i in ids)
    results = run(interp, Options(tiers=(1, 2), quick=True, dtypes=("bfloat16",))).results
    assert any(r.case.tier == 1 for r in results)   # prerequisites have no dtype: kept
    assert all(r.case.dtype is None or "bfloat16" in r.case.dtype.split("->") for r in results)
    assert "ops/CAST/bfloat16->bool" in [r.case.id for r in results]


def test_xfail_file_needs_a_reason_per_line():
    entries = suite.parse_xfail("# comment\nops/SIN/*  polynomial too coarse\n\n")
    assert entries == {"ops/SIN/*": "polynomial too coarse"}
    with pytest.raises(ValueError, match="has no reason"):
        suite.parse_xfail("ops/SIN/float32\n")
    with pytest.raises(ValueError, match="no space"):
        suite.parse_xfail("ops/SIN/*  coarse\n! ops/SIN/float64\n")


def test_an_exclusion_takes_cases_out_of_every_entry_whatever_the_order():
    entries = suite.parse_xfail("!ops/MAX/int*\nops/MAX/*  NaN handling\nops/*/int32  other\n")
    assert entries["!ops/MAX/int*"] == ""
    assert suite.xfail_reason("ops/MAX/float32", entries) == "NaN handling"
    assert suite.xfail_reason("ops/MAX/int32", entries) is None
    assert suite.xfail_reason("ops/ADD/int32", entries) == "other"


def test_cli_exit_codes_and_reports(tmp_path, capsys):
    args = ["conform", "--backend", "interpreter", "--quick", "--tier", "1", "--tier", "3",
            "--json", str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml"),
            "--html", str(tmp_path / "r.html")]
    assert cli.main(args) == 0
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is True
    assert (tmp_path / "r.xml").exists() and (tmp_path / "r.html").exists()
    assert cli.main(["conform", "--backend", "no-such-backend"]) == 2
    (tmp_path / "bad.txt").write_text("ops/ADD/int8\n")
    assert cli.main(["conform", "--backend", "interpreter", "--xfail",
                     str(tmp_path / "bad.txt")]) == 2
    assert "has no reason" in capsys.readouterr().out


def test_available_prints_one_line_per_backend(capsys):
    assert cli.main(["conform", "--available", "--quick", "--tier", "1"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert any(line.startswith("interpreter") and "OK" in line for line in lines)
    assert any("not available" in line for line in lines) or len(lines) >= 2


def test_edge_values_cover_every_class_in_every_operand():
    inputs, labels = generate.op_inputs(Op.ADD, dtypes.float32, np.random.default_rng(0), 8)
    for name, values in generate.edge_values(dtypes.float32).items():
        for column in inputs:
            assert np.isin(column.view(np.int32), values.view(np.int32)).any(), name
    assert "nan,inf" in labels and labels[-1] == "random"
    assert set(generate.edge_values(dtypes.int8)) == {"zero", "one", "min", "max"}
    assert generate.edge_values(dtypes.uint8)["min"][0] == 0


def test_the_schema_file_is_valid_and_describes_the_report(broken_report, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    schema = report.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    data = report.to_dict(broken_report)
    jsonschema.validate(data, schema)
    data["cases"][0]["status"] = "flaky"        # not a status: the schema must say so
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)
    assert schema["properties"]["schema_version"]["const"] == report.SCHEMA_VERSION


def test_junit_has_the_standard_attributes_and_properties(broken_report, tmp_path):
    path = tmp_path / "r.xml"
    report.write_junit(broken_report, path)
    root = ET.parse(path).getroot()
    counts = broken_report.counts()
    skipped = counts["blocked"] + counts["unsupported"] + counts["xfail"] + 1   # + models
    assert int(root.get("tests")) == len(broken_report.results) + 1
    assert int(root.get("failures")) == counts["failed"] + counts["xpass"]
    assert int(root.get("skipped")) == skipped and root.get("errors") == "0"
    for tier in root:
        assert {"tests", "failures", "errors", "skipped", "time", "timestamp",
                "hostname"} <= set(tier.attrib)
        properties = {p.get("name"): p.get("value") for p in tier.find("properties")}
        assert properties["backend"] == "broken-sin" and properties["seed"] == "0"
    ops = {s.get("name"): s for s in root}["broken-sin.ops"]
    assert int(ops.get("skipped")) == len(ops.findall("testcase/skipped"))


def test_html_shows_every_tier_blocked_by_cause_and_perf_on_a_log_scale(broken_report,
                                                                       tmp_path):
    path = tmp_path / "r.html"
    report.write_html(broken_report, path)
    html = path.read_text()
    assert "Tier 4: tensor" in html and "Tier 6: perf" in html
    assert "tensor/add/float32/fwd" in html
    causes = report.blocked_by_cause(report.to_dict(broken_report))
    assert causes and next(iter(causes)).startswith("ops/SIN/")
    assert sum(map(len, causes.values())) == broken_report.counts()["blocked"]
    assert f"<b>{next(iter(causes))}</b> blocked" in html
    assert "log scale" in html


def test_perf_bars_are_logarithmic():
    bars = report.perf_bars([{"ratio": 0.01}, {"ratio": 1.0}, {"ratio": 100.0},
                             {"ratio": None}], width=400)
    x = [b["x"] for b in bars["bars"]]
    assert x[3] is None and bars["one"] == x[1]
    assert x[1] - x[0] == pytest.approx(x[2] - x[1])    # 100x either side: equal distances


def test_progress_shows_an_eta_and_whole_case_names_at_80_columns():
    from portkit.conformance import cli as conform_cli

    progress = conform_cli.progress_bar(Console(width=80))
    name = "opencl: tensor/cross_entropy/float32/bwd"
    progress.update(progress.add_task(name, total=331), completed=50)
    console = Console(width=80, record=True)
    console.print(progress.make_tasks_table(progress.tasks))
    shown = console.export_text()
    assert "eta" in shown and "50/331" in shown and name in shown
