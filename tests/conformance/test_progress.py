"""Conformance progress: kernels compile in batches and a CI log gets plain lines, compiling
N/M then running N/M, from the isolated worker as from this process."""
from __future__ import annotations

import io
import re

import pytest

from portkit import runtime
from portkit.cli import main
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
        found = re.findall(rf"^portkit: {what} (\d+)/(\d+)$", out, re.MULTILINE)
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
