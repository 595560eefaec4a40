"""Crash isolation: a backend that segfaults, aborts or hangs costs one case, never the run."""
import json
import xml.etree.ElementTree as ET

import pytest

from portkit.cli import main
from portkit.conformance import runner, suite
from portkit.conformance.case import Status
from portkit.conformance.target import Target

CRASHES = {"ops/SIN/float32": ("crashed", "SIGSEGV"),
           "ops/EXP2/float32": ("crashed", "SIGABRT"),
           "ops/LOG2/float32": ("timeout", "ran past the 8 s limit")}


@pytest.fixture
def crashy(broken, fake_backends):
    """The backend `crashy` (broken_backends.crashing), registered by name."""
    fake_backends({"crashy": "broken_backends:crashing_backend"})


def test_segfault_abort_and_hang_are_reported_and_the_run_goes_on(crashy, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["conform", "--backend", "crashy", "--tier", "1", "--tier", "2", "--quick",
                 "--dtype", "float32", "--timeout", "8", "--json", str(out / "r.json"),
                 "--junit", str(out / "r.xml"), "--html", str(out / "r.html"),
                 "--repro-dir", str(tmp_path / "repro")])
    assert code == 1
    data = json.loads((out / "r.json").read_text())
    cases = {c["id"]: c for c in data["cases"]}
    for case_id, (status, how) in CRASHES.items():
        assert cases[case_id]["status"] == status, cases[case_id]
        assert how in cases[case_id]["message"]
        assert "crashing_backend" not in cases[case_id]["message"]
        assert cases[case_id]["kernel"] and cases[case_id]["source"]
        assert cases[case_id]["replay"].startswith("portkit replay ")
    for case_id in CRASHES:     # where the worker was, from its fault handler
        assert "broken_backends.py\", line" in cases[case_id]["message"]
    # every other case ran to its end (ops/MMA/none: no matrix unit declared, unsupported)
    others = [c for c in data["cases"] if c["id"] not in CRASHES and c["id"] != "ops/MMA/none"]
    assert len(others) > 20 and {c["status"] for c in others} == {"passed"}
    assert data["summary"]["crashed"] == 2 and data["summary"]["timeout"] == 1
    assert not data["ok"]
    junit = ET.parse(out / "r.xml").getroot()
    errors = {case.get("name"): case.find("error").get("message")
              for case in junit.iter("testcase") if case.find("error") is not None}
    assert set(errors) == set(CRASHES) and junit.get("errors") == "3"
    html = (out / "r.html").read_text()
    assert all(f"{case_id} &mdash; {status}" in html
               for case_id, (status, _) in CRASHES.items())
    terminal = capsys.readouterr().out
    assert "crashed" in terminal and "timeout" in terminal


def test_a_crash_blocks_what_requires_the_crashed_case(crashy, tmp_path):
    target = Target.load("crashy")
    report = runner.run(target, suite.Options(tiers=(2, 4), quick=True, timeout=30,
                                             pattern="*[Ss][Ii][Nn]/float32*",
                                             repro_dir=str(tmp_path)))
    statuses = {r.case.id: r.status for r in report.results}
    assert statuses["ops/SIN/float32"] is Status.CRASHED
    blocked = [r for r in report.results if r.case.tier == 4]
    assert {r.case.id for r in blocked} == {"tensor/sin/float32/fwd", "tensor/sin/float32/bwd"}
    assert all(r.status is Status.BLOCKED and "ops/SIN/float32 (crashed)" in r.message
               for r in blocked)


def test_xfail_covers_a_known_crash(crashy, tmp_path):
    options = suite.Options(tiers=(2,), quick=True, pattern="ops/SIN/float32",
                            xfail={"ops/SIN/float32": "driver bug 123"},
                            repro_dir=str(tmp_path))
    [result] = runner.run(Target.load("crashy"), options).results
    assert result.status is Status.XFAIL
    assert result.message.startswith("expected failure (driver bug 123): crashed: the worker")


def test_auto_isolates_a_backend_loaded_by_name_and_none_does_not(crashy, broken):
    from portkit.conformance.isolate import Isolated

    target = Target.load("crashy")
    assert type(runner.executor(target, suite.Options())) is Isolated
    assert type(runner.executor(target, suite.Options(isolate="none"))) is suite.InProcess
    handed_in = Target(broken.crashing())
    assert type(runner.executor(handed_in, suite.Options())) is suite.InProcess
    with pytest.raises(ValueError, match="'auto', 'process' or 'none'"):
        runner.executor(target, suite.Options(isolate="fork"))


def test_a_device_handed_in_cannot_be_isolated(broken):
    with pytest.raises(ValueError, match="--isolate none"):
        runner.run(Target(broken.crashing()), suite.Options(tiers=(2,), isolate="process"))


QUITS = """
import os
from portkit.abi import ABI_VERSION, Backend

def _load():
    os._exit(9)

backend = Backend("quits", _load, abi_version=ABI_VERSION)
"""


def test_conform_survives_a_backend_that_exits_while_loading(fake_backends, fake_backend_module,
                                                             capsys):
    fake_backends({"quits": fake_backend_module(QUITS)})
    assert main(["conform", "--backend", "quits", "--tier", "1"]) == 2
    assert "ended the process: exit code 9" in " ".join(capsys.readouterr().out.split())


def test_conform_available_lists_a_backend_that_exits_and_checks_the_rest(
        fake_backends, fake_backend_module, capsys):
    fake_backends({"quits": fake_backend_module(QUITS),
                   "interpreter": "portkit.reference_backends.interpreter:backend"})
    assert main(["conform", "--available", "--quick", "--tier", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "quits not available: broken backend package: loading it ended the process" in out
    assert "interpreter OK" in out


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_a_bad_timeout_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["conform", "--backend", "interpreter", "--timeout", value])
    assert exit_.value.code == 2 and "number of seconds" in capsys.readouterr().err


COUNTED = """
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends import interpreter

def _load():
    with open({path!r}, "a") as log:
        log.write("loaded\\n")
    return interpreter.backend.load()

backend = Backend("counted", _load, abi_version=ABI_VERSION)
"""


def test_an_isolated_run_loads_the_backend_twice_probe_and_worker(
        fake_backends, fake_backend_module, tmp_path):
    """The worker reports the capabilities, so the runner never loads the backend itself."""
    loads = tmp_path / "loads.txt"
    fake_backends({"counted": fake_backend_module(COUNTED.format(path=str(loads)))})
    code = main(["conform", "--backend", "counted", "--tier", "1", "--tier", "2", "--quick",
                 "--dtype", "int32", "-k", "ops/ADD/*", "--isolate", "process",
                 "--json", str(tmp_path / "r.json")])
    assert code == 0
    assert loads.read_text().count("loaded") == 2      # the probe, then the worker
    report = json.loads((tmp_path / "r.json").read_text())
    assert {c["id"]: c["status"] for c in report["cases"]}["ops/ADD/int32"] == "passed"
    assert "int32" in report["capabilities"]["dtypes"]


def test_a_crashed_cases_source_is_rendered_by_the_next_worker(crashy, capsys, tmp_path):
    from portkit.conformance.isolate import WorkerTarget

    target = WorkerTarget("crashy", "broken_backends:crashing_backend",
                          suite.Options(timeout=30))
    assert target.device is None and "float32" in {d.name for d in target.capabilities.dtypes}
    report = runner.run(target, suite.Options(tiers=(2,), quick=True, timeout=30,
                                             pattern="ops/SIN/float32", repro_dir=str(tmp_path)))
    [result] = [r for r in report.results if r.case.id == "ops/SIN/float32"]
    assert result.status is Status.CRASHED and result.source and "sin" in result.source.lower()


@pytest.mark.parametrize("isolate", ["none", "process"])
def test_portkit_debug_prints_each_launch_under_conform(isolate, monkeypatch, capfd):
    monkeypatch.setenv("PORTKIT_DEBUG", "3")
    code = main(["conform", "--backend", "interpreter", "--tier", "2", "--quick", "--dtype",
                 "int32", "-k", "ops/XOR/*", "--isolate", isolate])
    assert code == 0
    err = capfd.readouterr().err
    assert "portkit: conform" in err and "grid (" in err, err[-2000:]
    assert '"op": "XOR"' in err        # level 3: the kernel's JSON at its first launch
