"""The pytest plugin runs the same cases as `portkit conform`, with the same verdicts: pass,
fail, blocked and unsupported as skips naming why, xfail-file entries as xfail; and it spreads
over pytest-xdist workers without changing a verdict."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from portkit.conformance import Options, Status, Target, run

ROOT = Path(__file__).resolve().parents[2]
# The plugin by module name; `no:portkit` keeps an installed entry point from loading it twice.
PLUGIN = ["-p", "no:portkit", "-p", "portkit.conformance.pytest_plugin"]


class Outcomes:
    """Records each item's final outcome and, for skips and failures, the text pytest shows."""

    def __init__(self):
        self.outcome: dict[str, str] = {}
        self.text: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        name = report.nodeid.split("::", 1)[1]
        if report.when == "call" or report.outcome != "passed":
            outcome = "xfailed" if hasattr(report, "wasxfail") else report.outcome
            self.outcome[name] = outcome
            self.text[name] = report.longreprtext


def _pytest(tmp_path, *args) -> tuple[int, Outcomes]:
    outcomes = Outcomes()
    (tmp_path / "none.ini").write_text("[pytest]\n")
    code = pytest.main([*PLUGIN, "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        "-c", str(tmp_path / "none.ini"), "--portkit-repro-dir",
                        str(tmp_path / "repro"), *args], plugins=[outcomes])
    return int(code), outcomes


_PYTEST_OUTCOME = {Status.PASSED: "passed", Status.FAILED: "failed", Status.XPASS: "failed",
                   Status.BLOCKED: "skipped", Status.UNSUPPORTED: "skipped",
                   Status.XFAIL: "xfailed"}


def _conform(name: str, tmp_path, tiers=(1, 2, 3), **options) -> dict[str, str]:
    report = run(Target.load(name), Options(tiers=tiers, quick=True,
                                            repro_dir=str(tmp_path / "conform"), **options))
    return {r.case.id: _PYTEST_OUTCOME[r.status] for r in report.results}


def test_same_cases_and_verdicts_as_conform(tmp_path):
    code, got = _pytest(tmp_path, "--portkit-backend", "interpreter", "--portkit-quick",
                        *[f"--portkit-tier={t}" for t in (1, 2, 3)])
    expected = _conform("interpreter", tmp_path)
    assert code == 0 and len(got.outcome) == len(expected) > 250
    assert got.outcome == expected


def test_a_broken_op_fails_exactly_the_cases_conform_fails(broken, fake_backends, tmp_path):
    fake_backends({"broken-sin": "broken_backends:sin_backend",
                   "interpreter": "portkit.reference_backends.interpreter:backend"})
    code, got = _pytest(tmp_path, "--portkit-backend", "broken-sin", "--portkit-quick",
                        *[f"--portkit-tier={t}" for t in (1, 2, 3)])
    expected = _conform("broken-sin", tmp_path)
    assert code == 1 and got.outcome == expected
    failed = {case for case, outcome in got.outcome.items() if outcome == "failed"}
    assert "ops/SIN/float32" in failed
    assert "portkit replay" in got.text["ops/SIN/float32"]
    assert "Traceback" not in got.text["ops/SIN/float32"]
    blocked = got.text["kernels/fused-elementwise/float32"]
    assert "blocked by ops/SIN/float32 (failed)" in blocked


def test_prerequisites_run_even_when_deselected(broken, fake_backends, tmp_path):
    # -k leaves only the fused kernel, whose SIN prerequisite then runs unreported, so the
    # verdict is the same as in a whole run: blocked.
    fake_backends({"broken-sin": "broken_backends:sin_backend"})
    code, got = _pytest(tmp_path, "--portkit-backend", "broken-sin", "--portkit-quick",
                        "--portkit-tier=1", "--portkit-tier=2", "--portkit-tier=3",
                        "-k", "fused-elementwise and float32")
    assert got.outcome == {"kernels/fused-elementwise/float32": "skipped"}
    assert code == 0


def test_xfail_file_entries_are_xfail_and_markers_select(broken, fake_backends, tmp_path):
    fake_backends({"broken-sin": "broken_backends:sin_backend"})
    xfail = tmp_path / "xfail.txt"
    xfail.write_text("ops/SIN/float*  polynomial off by 1e-3\n")
    code, got = _pytest(tmp_path, "--portkit-backend", "broken-sin", "--portkit-quick",
                        "--portkit-tier=2", "--portkit-xfail", str(xfail),
                        "-m", "portkit(op='SIN')")
    # float16's budget of 2 ULP (about 2e-3 near 1) swallows the error: a stale entry, failed.
    assert got.outcome == _conform("broken-sin", tmp_path, tiers=(2,), pattern="ops/SIN/*",
                                   xfail={"ops/SIN/float*": "off"}, xfail_file="xfail.txt")
    assert got.outcome["ops/SIN/float32"] == "xfailed" and code == 1
    assert "remove it from" in got.text["ops/SIN/float16"]


def test_an_unknown_backend_is_a_usage_error(tmp_path, capsys):
    code, _ = _pytest(tmp_path, "--portkit-backend", "no-such-backend")
    assert code == pytest.ExitCode.USAGE_ERROR
    assert "--portkit-backend no-such-backend" in capsys.readouterr().err


def test_xdist_workers_run_the_same_count(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(ROOT), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *PLUGIN, "-n", "2", "-q", "-p", "no:cacheprovider",
         "--portkit-backend", "interpreter", "--portkit-quick", "--portkit-tier=1",
         "--portkit-tier=3", "--junitxml", str(tmp_path / "j.xml")],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    count = len(_conform("interpreter", tmp_path, tiers=(1, 3)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{count} passed" in done.stdout
    assert (tmp_path / "j.xml").read_text().count("<testcase ") == count


def test_the_plugin_is_registered_for_pytest():
    project = (ROOT / "pyproject.toml").read_text()
    assert ('[project.entry-points.pytest11]\nportkit = "portkit.conformance.pytest_plugin"'
            in project)


def test_last_failed_reruns_only_the_failed_cases(broken, fake_backends, tmp_path):
    fake_backends({"broken-sin": "broken_backends:sin_backend"})
    args = ["-p", "cacheprovider", "-o", f"cache_dir={tmp_path / 'cache'}", "--portkit-backend",
            "broken-sin", "--portkit-quick", "--portkit-tier=1", "--portkit-tier=2"]
    code, first = _pytest(tmp_path, *args)
    failed = {case for case, outcome in first.outcome.items() if outcome == "failed"}
    assert code == 1 and "ops/SIN/float32" in failed
    code, again = _pytest(tmp_path, *args, "--lf")
    assert code == 1 and set(again.outcome) == failed
