"""Conformance progress: kernels compile in batches and a CI log gets plain lines, compiling
N/M then running N/M with the counts so far, from the isolated worker as from this process."""
from __future__ import annotations

import io
import re

import pytest

from portkit import runtime
from portkit.cli import main
from portkit.conformance.case import Case, Result, Status
from portkit.conformance.progress_log import LogProgress
from portkit.runtime.progress import Lines


@pytest.mark.parametrize("isolate", ["process", "none"])
def test_conform_prints_compile_and_run_progress_in_a_log(isolate, capsys, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    runtime.clear()     # kernels another test compiled in this process would not compile again
    assert main(["conform", "--backend", "cpu", "--quick", "--tier", "2", "-k", "ops/ADD",
                 "--isolate", isolate]) == 0
    out = capsys.readouterr().out
    for what in ("compiling", "running"):
        found = re.findall(rf"^portkit: {what} (\d+)/(\d+) ", out, re.MULTILINE)
        assert found, f"no '{what}' line in:\n{out}"
        assert found[-1][0] == found[-1][1] and int(found[-1][1]) > 1


def test_lines_print_each_tenth_and_the_end():
    stream = io.StringIO()
    show = Lines("compiling", stream)
    for done in range(1, 101):
        show(done, 100)
    shown = stream.getvalue().splitlines()
    assert shown[0] == "portkit: compiling 1/100" and shown[-1] == "portkit: compiling 100/100"
    assert len(shown) == 11
    show(3, 40)     # a new round starts again from its first report
    assert stream.getvalue().splitlines()[-1] == "portkit: compiling 3/40"


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _result(status: Status) -> Result:
    return Result(Case("ops/ADD/float32", 2), status)


def test_log_lines_come_after_5_s_and_a_tenth_or_after_a_minute_with_counts():
    stream, clock = io.StringIO(), FakeClock()
    log = LogProgress(stream, clock)
    log.compiled(10, 40)                       # the start of a round: shown
    clock.now += 1
    log.compiled(40, 40)                       # its end: shown
    statuses = [Status.PASSED] * 150 + [Status.FAILED, Status.BLOCKED] * 25
    for done, status in enumerate(statuses, 1):     # 200 instant cases: one line, the first
        log.ran(_result(status), done, 400)
    for done in range(201, 251):               # then 1 s each: a line once both 5 s and a
        clock.now += 1                         # tenth (40 cases) passed: at 205, then 245
        log.ran(_result(Status.PASSED), done, 400)
    clock.now += 61                            # a minute without a line: shown anyway
    log.ran(_result(Status.XFAIL), 251, 400)
    lines = stream.getvalue().splitlines()
    assert lines == [
        "portkit: compiling 10/40 kernels (0 s)",
        "portkit: compiling 40/40 kernels (1 s)",
        "portkit: running 1/400 cases (1 s): 1 passed, 0 failed, 0 blocked",
        "portkit: running 205/400 cases (6 s): 155 passed, 25 failed, 25 blocked",
        "portkit: running 245/400 cases (46 s): 195 passed, 25 failed, 25 blocked",
        "portkit: running 251/400 cases (112 s): 200 passed, 25 failed, 25 blocked, 1 other"]
    for done in range(252, 401):
        log.ran(_result(Status.PASSED), done, 400)
    assert stream.getvalue().splitlines()[-1].startswith("portkit: running 400/400 cases")
