"""Shards merged equal one unsharded run; `report diff` flags new failures and perf drops and
passes two clean runs."""
import copy
import json

import pytest

from portkit import cli
from portkit.conformance import compare

QUICK = ["--quick", "--tier", "1", "--tier", "2", "--tier", "3"]


def _without_timings(data: dict) -> dict:
    data = copy.deepcopy(data)
    for key in ("seconds", "started"):
        data.pop(key)
    data["options"].pop("shard")
    for case in data["cases"]:
        case.pop("seconds")
    return data


@pytest.fixture
def sin_broken(broken, fake_backends):
    fake_backends({"broken-sin": "broken_backends:sin_backend",
                   "interpreter": "portkit.reference_backends.interpreter:backend"})


def test_three_shards_merged_equal_the_whole_run(sin_broken, tmp_path, capsys):
    repro = ["--repro-dir", str(tmp_path / "repro")]
    whole = tmp_path / "whole.json"
    assert cli.main(["conform", "--backend", "broken-sin", *QUICK, *repro,
                     "--json", str(whole)]) == 1
    shards = [tmp_path / f"shard{i}.json" for i in (1, 2, 3)]
    for number, path in enumerate(shards, 1):
        cli.main(["conform", "--backend", "broken-sin", *QUICK, *repro, "--shard",
                  f"{number}/3", "--json", str(path)])
    sizes = [len(json.loads(p.read_text())["cases"]) for p in shards]
    merged = tmp_path / "merged" / "all.json"
    capsys.readouterr()
    # Shards in any order: the merge restores the whole run's order.
    assert cli.main(["report", "merge", *map(str, shards[::-1]), "--json", str(merged),
                     "--html", str(tmp_path / "merged.html"),
                     "--junit", str(tmp_path / "merged.xml")]) == 1
    assert "FAILED: 3 reports" in capsys.readouterr().out
    expected = json.loads(whole.read_text())
    got = json.loads(merged.read_text())
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == len(expected["cases"])
    # Blocked cases are blocked in their shard too: their prerequisites ran there.
    assert expected["summary"]["blocked"] > 0
    assert _without_timings(got) == _without_timings(expected)
    assert "ops/SIN/float32" in (tmp_path / "merged.html").read_text()


def test_merge_refuses_overlapping_shards_and_other_runs(tmp_path, capsys):
    one = tmp_path / "one.json"
    assert cli.main(["conform", "--backend", "interpreter", "--quick", "--tier", "1",
                     "--json", str(one)]) == 0
    assert cli.main(["report", "merge", str(one), str(one)]) == 2
    assert "merge distinct shards" in " ".join(capsys.readouterr().out.split())
    other = json.loads(one.read_text())
    other["options"]["seed"] = 7
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(compare.ReportError, match="differ in seed"):
        compare.merge([json.loads(one.read_text()), other], ["one.json", "other.json"])
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 1}))
    assert cli.main(["report", "merge", str(tmp_path / "old.json")]) == 2
    assert "not a JSON report of schema version 2 or 3" in " ".join(
        capsys.readouterr().out.split())


PERF = [{"name": "copy", "seconds": 0.010, "reference_seconds": 0.01, "ratio": 1.0,
         "value": 2.0, "unit": "GB/s", "peak_fraction": None, "warning": None,
         "case": "perf/copy"}]


def test_diff_passes_clean_runs_and_flags_a_regression_and_a_perf_drop(tmp_path, capsys):
    runs = []
    for night in ("old", "new"):
        path = tmp_path / f"{night}.json"
        assert cli.main(["conform", "--backend", "interpreter", *QUICK, "--json",
                         str(path)]) == 0
        data = json.loads(path.read_text())
        data["perf"] = copy.deepcopy(PERF)
        path.write_text(json.dumps(data))
        runs.append(data)
    old, new = (str(tmp_path / "old.json"), str(tmp_path / "new.json"))
    capsys.readouterr()
    assert cli.main(["report", "diff", old, new]) == 0
    assert "no regression" in capsys.readouterr().out

    worse = copy.deepcopy(runs[1])
    [add] = [c for c in worse["cases"] if c["id"] == "ops/ADD/float32"]
    add.update(status="failed", message="1 of 48 elements wrong")
    worse["perf"][0]["seconds"] = 0.020             # twice as slow: beyond 25% noise
    (tmp_path / "worse.json").write_text(json.dumps(worse))
    html = tmp_path / "diff" / "diff.html"
    assert cli.main(["report", "diff", old, str(tmp_path / "worse.json"),
                     "--html", str(html)]) == 1
    output = capsys.readouterr().out
    assert "new failures (1)" in output and "ops/ADD/float32: passed -> failed" in output
    assert "copy: 0.01 s -> 0.02 s (+100%)" in output and "REGRESSED" in output
    assert "ops/ADD/float32" in html.read_text() and "REGRESSED" in html.read_text()
    # ... and back again: a fix and a faster benchmark are not regressions.
    assert cli.main(["report", "diff", str(tmp_path / "worse.json"), new]) == 0
    output = capsys.readouterr().out
    assert "fixed (1)" in output and "faster (1)" in output


def test_perf_moves_within_the_noise_are_not_reported():
    old = {"cases": [], "perf": copy.deepcopy(PERF)}
    new = {"cases": [], "perf": [{**PERF[0], "seconds": 0.012}]}
    assert not compare.diff(old, new).regressed
    assert compare.diff(old, new, noise=0.1).slower[0]["name"] == "copy"


def test_a_version_2_report_still_reads_and_merges_as_version_3(tmp_path):
    one = tmp_path / "one.json"
    assert cli.main(["conform", "--backend", "interpreter", "--quick", "--tier", "1",
                     "--json", str(one)]) == 0
    old = json.loads(one.read_text())
    old["schema_version"] = 2
    (tmp_path / "v2.json").write_text(json.dumps(old))
    assert compare.merge([compare.load(tmp_path / "v2.json")], ["v2.json"])[
        "schema_version"] == 3


def _perf(seconds: float, low: float, high: float, noisy: bool = False) -> dict:
    return {**PERF[0], "seconds": seconds, "min_seconds": low, "max_seconds": high,
            "noisy": noisy}


def test_a_perf_move_within_a_runs_spread_or_marked_noisy_is_not_a_regression(capsys):
    old = {"cases": [], "perf": [_perf(0.010, 0.009, 0.011)]}
    noisy = {"cases": [], "perf": [_perf(0.020, 0.008, 0.030, noisy=True)]}
    found = compare.diff(old, noisy)
    assert not found.regressed and not found.slower
    assert found.noisy[0]["why"] == "marked noisy in the new run"
    spread = {"cases": [], "perf": [_perf(0.020, 0.010, 0.021)]}   # old median among new repeats
    assert compare.diff(old, spread).noisy[0]["why"].startswith("within the new run's repeats")
    assert compare.diff(spread, old).noisy and not compare.diff(spread, old).faster
    compare.print_diff(compare.diff(noisy, noisy), _console())
    compare.print_diff(found, _console())
    output = capsys.readouterr().out
    assert "moved, but within the noise of a run" in output and "no regression" in output
    tight = {"cases": [], "perf": [_perf(0.020, 0.019, 0.021)]}
    assert compare.diff(old, tight).regressed and compare.diff(old, tight).slower


def _console():
    from rich.console import Console

    return Console(width=200)


def _case(case_id: str, status: str, message: str = "") -> dict:
    return {"id": case_id, "status": status, "message": message}


def test_passed_then_blocked_is_listed_and_regresses_only_on_a_new_upstream_failure():
    old = {"perf": [], "cases": [_case("ops/SIN/float32", "passed"),
                                 _case("ops/EXP2/float32", "xfail"),
                                 _case("kernels/a", "passed"), _case("kernels/b", "passed"),
                                 _case("kernels/c", "passed")]}
    new = {"perf": [], "cases": [
        _case("ops/SIN/float32", "xfail"), _case("ops/EXP2/float32", "xfail"),
        _case("kernels/a", "blocked", "blocked by ops/SIN/float32 (xfail)"),
        _case("kernels/b", "blocked", "blocked by ops/EXP2/float32 (xfail)"),
        _case("kernels/c", "unsupported", "the device declares no LOCAL memory")]}
    found = compare.diff(old, new)
    assert [d["id"] for d in found.newly_blocked] == ["kernels/a"]     # SIN newly xfail
    assert [d["id"] for d in found.not_run] == ["kernels/b", "kernels/c"]
    assert found.regressed and not found.new_failures
    new["cases"][0]["status"] = old["cases"][0]["status"] = "xfail"
    assert not compare.diff(old, new).regressed
    assert compare.blockers("blocked by a/b (failed), c (xfail) and 2 more") == ["a/b", "c"]
