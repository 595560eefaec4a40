"""Progress of long compiles: shown once a compile has taken PORTKIT_PROGRESS seconds, as plain
lines when stderr is not a terminal, and never for a quick one."""
from __future__ import annotations

import time

import numpy as np
import pytest

from portkit import Tensor, settings
from portkit.runtime import progress


def test_a_delayed_report_shows_nothing_before_its_time(capsys):
    with progress.delayed("compiling", 60.0, 4) as report:
        for done in range(1, 5):
            report(done, 4)
    assert capsys.readouterr().err == ""


def test_a_delayed_report_shows_where_it_stands_once_its_time_has_come(capsys):
    with progress.delayed("compiling", 0.05, 4) as report:
        report(1, 4)
        time.sleep(0.5)
        report(4, 4)
    err = capsys.readouterr().err
    assert "portkit: compiling 1/4" in err and "portkit: compiling 4/4" in err


@pytest.mark.parametrize("value, shown", [("0", True), ("off", False), ("", False)])
def test_compile_all_shows_progress_past_the_setting(monkeypatch, capsys, value, shown):
    monkeypatch.setenv("PORTKIT_PROGRESS", value)
    scale = 1.0 + np.random.default_rng().random()      # kernels no cache has seen
    x = Tensor(np.arange(5, dtype=np.float32), device="cpu") * scale
    out = (x - x.mean()).numpy()        # two kernels: the mean, then the difference
    np.testing.assert_allclose(out, (np.arange(5) - 2) * np.float32(scale), rtol=1e-5, atol=1e-6)
    assert ("portkit: compiling 2 cpu kernels 2/2" in capsys.readouterr().err) is shown


def test_a_bad_value_names_the_setting(monkeypatch):
    monkeypatch.setenv("PORTKIT_PROGRESS", "soon")
    with pytest.raises(ValueError, match="PORTKIT_PROGRESS='soon'.*off"):
        settings.read("PORTKIT_PROGRESS")


def test_compile_all_ends_at_the_count_it_was_given():
    # a caller's count includes kernels that turn out the same as another, or compiled
    # already: progress ends at count of count, not short of it
    from portkit import runtime, schedule
    from portkit.codegen.lower import lower
    device = runtime.get("cpu")
    size = int(np.random.default_rng().integers(1000, 100_000))   # kernels no run has seen

    def kernel(n: int):
        item, = schedule.create_schedule([(Tensor(np.ones(n, np.float32), device="cpu")
                                           * 2).lazy])
        return lower(item.root, item.inputs, device.capabilities)
    compiled = kernel(size + 2)
    device.compile(compiled)
    kernels = [kernel(size), kernel(size), kernel(size + 1), compiled]
    seen: list[tuple[int, int]] = []
    with progress.reporting(lambda done, total: seen.append((done, total))):
        device.compile_all(iter(kernels), count=len(kernels))
    assert seen and seen[-1] == (4, 4), seen
