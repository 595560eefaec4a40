"""`portkit replay` refuses bad files in one line and never launches an out-of-bounds kernel
natively (issue 11, items 5 and 10)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from portkit.abi import KernelBuilder, dtypes
from portkit.conformance import replay
from portkit.conformance.case import Check, KernelCase
from portkit.conformance.cli import run_replay


def _store_at_group(size: int, grid: int) -> KernelCase:
    k = KernelBuilder("store_at_group")
    out = k.param(dtypes.float32)
    k.store(out, k.special("group", 0), k.const(1.0, dtypes.float32))
    kernel = k.build(grid=(grid, 1, 1), block=(1, 1, 1))
    check = Check(output=0, kind="exact", count=size, op="STORE", dtype="float32",
                  expected=(np.ones(size, np.float32),), mask=None, bound=None, operands=(),
                  labels=[])
    return KernelCase(kernel, [np.zeros(size, np.float32)], [check])


class _Args:
    def __init__(self, file, backend="cpu"):
        self.file, self.backend, self.show = str(file), backend, False


def test_an_out_of_bounds_store_is_refused_before_a_native_launch(tmp_path, capsys):
    path = replay.save(tmp_path / "oob.json", _store_at_group(16, 20), "case/oob", "cpu")
    kc, _ = replay.load(path)
    with pytest.raises(replay.ReplayError, match="accesses element 16 of a 16-element"):
        replay.check_bounds(kc)
    # before, cpu wrote 4 floats past the buffer, said "passes", then glibc aborted
    assert run_replay(_Args(path)) == 2
    out = capsys.readouterr().out
    assert "not launched natively" in out and "passes" not in out


def test_a_fitting_kernel_still_replays(tmp_path):
    path = replay.save(tmp_path / "ok.json", _store_at_group(16, 16), "case/ok", "cpu")
    assert run_replay(_Args(path)) == 0


@pytest.mark.parametrize("damage", ["no op", "src not a list", "no checks", "deep", "list",
                                    "bad base64"])
def test_a_malformed_file_is_one_line(tmp_path, capsys, damage):
    path = replay.save(tmp_path / "case.json", _store_at_group(4, 4), "case/x", "cpu")
    data = json.loads(path.read_text())
    if damage == "no op":
        del data["kernel"]["nodes"][0]["op"]
    elif damage == "src not a list":
        data["kernel"]["nodes"][2]["src"] = 7
    elif damage == "no checks":
        del data["checks"]
    elif damage == "deep":
        text = path.read_text().replace('"scalars": []', '"scalars": ' + "[" * 50_000
                                        + "]" * 50_000)
        path.write_text(text)
    elif damage == "list":
        data = [data]
    else:
        data["inputs"][0]["data"] = "###"
    if damage != "deep":
        path.write_text(json.dumps(data))
    with pytest.raises(replay.ReplayError, match="malformed|reproduction file"):
        replay.load(path)
    assert run_replay(_Args(path)) == 2
    out = capsys.readouterr().out
    assert "Traceback" not in out and "--repro-dir" in out   # one message (rich wraps it)
