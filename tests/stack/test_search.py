"""The tuner (portkit/schedule/search.py; lowering reads its choice through codegen/tune.py): it
keeps the fastest candidate by the timer's word, stores it per device and kernel structure, and
later lowerings (and searches) reuse it."""
from __future__ import annotations

import numpy as np
import pytest

from portkit import cli, runtime, schedule, settings
from portkit.abi.ops import Op
from portkit.codegen import tiles, tune
from portkit.codegen.lower import lower
from portkit.schedule import search
from portkit.tensor import Tensor


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path))
    monkeypatch.delenv("PORTKIT_BEAM", raising=False)
    return tmp_path


def _item(m: int = 40, k: int = 48, n: int = 24):
    x = Tensor(np.ones((m, k), np.float32), device="interpreter")
    w = Tensor(np.ones((k, n), np.float32), device="interpreter")
    item, = schedule.create_schedule([(x @ w).lazy])
    return item


def _fake_timer(fastest_threads: int, timed: list):
    """Seconds by the kernel's block: `fastest_threads` per group is fastest, untiled slowest."""
    def timer(kernel) -> float:
        timed.append(kernel)
        tiled = any(n.op is Op.LOCAL for n in kernel.nodes)
        return 1.0 if not tiled else (0.1 if kernel.block[0] == fastest_threads else 0.5)
    return timer


def test_the_tuner_keeps_the_candidate_the_timer_finds_fastest_and_lowering_reuses_it():
    rt = runtime.get("interpreter")
    item = _item()
    caps = rt.capabilities
    default = lower(item.root, item.inputs, caps)
    second = next(t for t in tiles.CANDIDATES[1:] if t.threads != default.block[0])
    timed: list = []
    found = search.search(rt, item.root, item.inputs, width=len(tiles.CANDIDATES),
                        timer=_fake_timer(second.threads, timed), progress=False)
    assert len(timed) == len(found.seconds) >= 3      # the fitting candidates and untiled
    assert found.choice.threads == second.threads
    assert found.seconds[found.choice] == 0.1
    contraction = tune.contraction(item.root, item.inputs, caps)
    assert tune.stored(caps, contraction) == found.choice
    assert lower(item.root, item.inputs, caps).block[0] == second.threads


def test_a_stored_untiled_verdict_turns_local_tiling_off():
    rt = runtime.get("interpreter")
    item = _item()

    def untiled_fastest(kernel) -> float:
        return 0.1 if Op.LOCAL not in {n.op for n in kernel.nodes} else 1.0

    found = search.search(rt, item.root, item.inputs, width=2, timer=untiled_fastest,
                        progress=False)
    assert found.choice == tiles.UNTILED
    assert Op.LOCAL not in {n.op for n in lower(item.root, item.inputs, rt.capabilities).nodes}


def test_choices_are_kept_per_kernel_structure():
    rt = runtime.get("interpreter")
    search.search(rt, _item().root, _item().inputs, width=2, timer=lambda k: 1.0, progress=False)
    other = _item(m=48)
    assert tune.stored(rt.capabilities, tune.contraction(other.root, other.inputs,
                                                         rt.capabilities)) is None


def test_portkit_beam_searches_once_then_reads_the_cache(monkeypatch, capsys):
    rt = runtime.get("interpreter")
    item = _item(16, 16, 16)
    monkeypatch.setenv("PORTKIT_BEAM", "2")
    search.ensure(rt, item.root, item.inputs)       # times on the interpreter itself
    contraction = tune.contraction(item.root, item.inputs, rt.capabilities)
    assert tune.stored(rt.capabilities, contraction) is not None
    assert "candidates in" in capsys.readouterr().err      # the search time is reported

    def fail(*args, **kwargs):
        raise AssertionError("searched again although a choice is stored")

    monkeypatch.setattr(search, "search", fail)
    search.ensure(rt, item.root, item.inputs)


def test_a_bad_portkit_beam_names_the_fix(monkeypatch):
    monkeypatch.setenv("PORTKIT_BEAM", "many")
    with pytest.raises(ValueError, match="whole number"):
        settings.read("PORTKIT_BEAM")


def test_portkit_tune_command_stores_a_choice(cache):
    assert cli.main(["tune", "--device", "interpreter", "--shape", "16", "16", "16",
                     "--beam", "1"]) == 0
    assert list((cache / "tune").rglob("*.json"))


def test_a_narrow_search_still_times_the_default_and_untiled():
    rt = runtime.get("interpreter")
    item = _item(20, 48, 24)       # small: the default is not the first candidate
    contraction = tune.contraction(item.root, item.inputs, rt.capabilities)
    default = tiles.choose(contraction, rt.capabilities)
    assert default != tiles.CANDIDATES[0]
    timed: list = []
    found = search.search(rt, item.root, item.inputs, width=1,
                        timer=_fake_timer(default.threads, timed), progress=False)
    assert set(found.seconds) == {tiles.CANDIDATES[0], default, tiles.UNTILED}
    assert found.choice == default


def test_a_view_whose_offset_is_an_argument_is_timed_at_its_offset(monkeypatch):
    # A's rows are (z + 1)[1:, 3]: its offset VAR (schedule/keys.py) is 1 * 320 + 3 * 64; at
    # 0 the kernel would read 5 rows before z's buffer
    rt = runtime.get("interpreter")
    z = Tensor(np.ones((65, 5, 64), np.float32), device="interpreter")
    w = Tensor(np.ones((64, 64), np.float32), device="interpreter")
    item, = schedule.create_schedule([((z + 1.0)[1:, 3] @ w).lazy])
    _, scalars = schedule.structure(item.root, item.inputs)
    timed: list = []

    def fake_time(compiled, buffers, words, repeats, give_up):
        timed.append(list(words))
        return [1.0] * repeats
    monkeypatch.setattr(rt, "time", fake_time)
    search.search(rt, item.root, item.inputs, width=1, scalars=scalars.nodes,
                  slots=scalars.slots, progress=False)
    assert timed and all(512 in words for words in timed)
