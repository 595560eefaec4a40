"""The suite catches deliberately broken backends with the right case and message, blocks the
cases that depend on the broken part, and writes a replay file that reproduces the failure."""
import pytest

from portkit import cli
from portkit.conformance import Options, Status, Target, replay, run, suite


def _run(device, tmp_path, tiers=(1, 2, 3), **options):
    return run(Target(device), Options(tiers=tiers, quick=True, repro_dir=str(tmp_path),
                                       **options))


def _result(report, case_id):
    [result] = [r for r in report.results if r.case.id == case_id]
    return result


def test_sin_off_by_1e3_fails_sin_and_blocks_its_users(broken, tmp_path):
    report = _run(broken.sin_off(), tmp_path)
    sin = _result(report, "ops/SIN/float32")
    assert sin.status is Status.FAILED
    assert "ULP (budget 4)" in sin.message and "worst at buffer 1[" in sin.message
    assert sin.worst["inputs"] and sin.worst["error"] > 4
    assert _result(report, "ops/SIN/float64").status is Status.FAILED
    fused = _result(report, "kernels/fused-elementwise/float32")
    assert fused.status is Status.BLOCKED and "ops/SIN/float32 (failed)" in fused.message
    # Nothing that avoids SIN is touched.
    assert _result(report, "ops/ADD/float32").status is Status.PASSED
    assert _result(report, "kernels/reduce-sum/float32/333").status is Status.PASSED
    assert not report.ok


def test_sin_replay_file_reproduces_on_the_broken_backend_only(broken, tmp_path):
    report = _run(broken.sin_off(), tmp_path, pattern="ops/SIN/float32")
    sin = _result(report, "ops/SIN/float32")
    assert sin.replay == f"portkit replay {sin.repro_path} --backend broken-sin"
    kc, meta = replay.load(sin.repro_path)
    assert meta == {"case": "ops/SIN/float32", "backend": "broken-sin"}
    [still] = replay.replay(kc, Target(broken.sin_off()))
    assert not still.ok and still.message == sin.message
    [fixed] = replay.replay(kc, Target.load("interpreter"))
    assert fixed.ok


def test_max_that_drops_nan_fails_on_nan_inputs_and_blocks_max_reductions(broken, tmp_path):
    report = _run(broken.max_nan(), tmp_path)
    result = _result(report, "ops/MAX/float32")
    assert result.status is Status.FAILED
    assert "nan" in result.worst["edge_class"] and "expected nan" in result.message
    assert _result(report, "ops/MAX/int32").status is Status.PASSED   # integers are fine
    blocked = _result(report, "kernels/reduce-max/float32/7")
    assert blocked.status is Status.BLOCKED and "ops/MAX/float32" in blocked.message
    assert _result(report, "kernels/fused-elementwise/int32").status is Status.PASSED


def test_copyout_dropping_the_last_byte_fails_runtime_and_blocks_all_above(broken, tmp_path):
    report = _run(broken.copyout_short(), tmp_path)
    roundtrip = _result(report, "runtime/roundtrip/1000")
    assert roundtrip.status is Status.FAILED
    assert "1 of 1000 bytes differ, first at byte 999" in roundtrip.message
    above = [r for r in report.results if r.case.tier > 1]
    assert above and all(r.status is Status.BLOCKED for r in above)
    assert "runtime/roundtrip/1 (failed)" in above[0].message


def test_replay_command_line_reproduces_and_exits_1(broken, tmp_path, fake_backends, capsys):
    fake_backends({"broken-sin": "broken_backends:sin_backend",
                   "interpreter": "portkit.reference_backends.interpreter:backend"})
    code = cli.main(["conform", "--backend", "broken-sin", "--quick", "--tier", "2",
                     "-k", "ops/SIN/float32", "--repro-dir", str(tmp_path)])
    assert code == 1
    path = tmp_path / "ops_SIN_float32.json"
    assert f"  portkit replay {path} --backend broken-sin\n" in capsys.readouterr().out
    assert cli.main(["replay", str(path), "--backend", "broken-sin"]) == 1
    assert "fails" in capsys.readouterr().out
    assert cli.main(["replay", str(path), "--backend", "interpreter"]) == 0


@pytest.mark.parametrize("listed, status", [("ops/SIN/float32", Status.XFAIL),
                                            ("ops/SIN/float32", Status.XPASS)])
def test_xfail_list_turns_failures_into_xfail_and_stale_entries_into_xpass(broken, tmp_path,
                                                                            listed, status):
    device = broken.sin_off() if status is Status.XFAIL else \
        broken.no_float16()
    report = _run(device, tmp_path, tiers=(2,), pattern=listed,
                  xfail={listed: "polynomial off by 1e-3"}, xfail_file="xfail.txt")
    result = _result(report, listed)
    assert result.status is status
    assert "polynomial off by 1e-3" in result.message
    if status is Status.XPASS:
        assert "remove it from xfail.txt" in result.message and not report.ok
    else:
        assert report.ok


def test_an_exclusion_line_narrows_a_glob_xfail_entry(broken, tmp_path):
    # `ops/MAX/*` alone turns MAX cases that pass into xpass: `!` lines spare them.
    xfail = suite.parse_xfail("ops/MAX/*  NaN handling\n!ops/MAX/int*\n!ops/MAX/uint*\n"
                              "!ops/MAX/bool\n")
    report = _run(broken.max_nan(), tmp_path, tiers=(2,), pattern="ops/MAX/*", xfail=xfail)
    statuses = {r.case.id: r.status for r in report.results}
    assert statuses["ops/MAX/float32"] is Status.XFAIL
    assert statuses["ops/MAX/int32"] is Status.PASSED and report.ok
    widened = _run(broken.max_nan(), tmp_path, tiers=(2,), pattern="ops/MAX/*",
                   xfail={"ops/MAX/*": "NaN handling"})
    assert {r.case.id: r.status for r in widened.results}["ops/MAX/int32"] is Status.XPASS


def test_declared_lack_of_a_dtype_is_unsupported_not_failed(broken, tmp_path):
    report = _run(broken.no_float16(), tmp_path, tiers=(2, 3), dtypes=("float16",))
    statuses = {r.case.id: r.status for r in report.results}
    assert statuses["ops/ADD/float16"] is Status.UNSUPPORTED
    assert "float16" in _result(report, "ops/ADD/float16").message
    assert statuses["ops/CAST/float16->float32"] is Status.UNSUPPORTED
    assert report.ok and Status.FAILED not in statuses.values()


def test_contracting_a_multiply_add_into_an_fma_fails_the_unfused_case(broken, tmp_path):
    report = run(Target(broken.contracts()), Options(tiers=(2, 3), repro_dir=str(tmp_path),
                                                     pattern="*/float[36][24]*"))
    for dtype in ("float32", "float64"):
        result = _result(report, f"kernels/unfused-multiply-add/{dtype}")
        assert result.status is Status.FAILED and "expected 0.0" in result.message
    # Every op on its own is right: only the pair is contracted.
    assert _result(report, "ops/MUL/float32").status is Status.PASSED
    assert _result(report, "ops/ADD/float32").status is Status.PASSED


def test_a_wrong_op_names_the_decompositions_that_spread_it(broken, tmp_path):
    # CMPNE that says "equal" for NaN; and a device without MAX, which decomposes it through
    # CMPNE: ops/MAX then fails too, and says why.
    report = _run(broken.cmpne_nan_without_max(), tmp_path, tiers=(2,),
                  pattern="ops/*/float32")
    assert _result(report, "ops/CMPNE/float32").status is Status.FAILED
    max_result = _result(report, "ops/MAX/float32")
    assert max_result.status is Status.FAILED
    assert "this backend lacks MAX, so the kernel ran them decomposed into" in max_result.message
    assert "CMPNE" in max_result.message.split("decomposed into", 1)[1]
    assert "decomposed" not in _result(report, "ops/CMPNE/float32").message


def test_replay_show_prints_the_decomposed_kernel_and_its_source(broken, tmp_path,
                                                                 fake_backends, capsys):
    report = _run(broken.cmpne_nan_without_max(), tmp_path, tiers=(2,),
                  pattern="ops/MAX/float32")
    path = _result(report, "ops/MAX/float32").repro_path
    kc, _ = replay.load(path)
    text = replay.describe(kc, Target(broken.cmpne_nan_without_max()))
    assert "this backend lacks MAX, so the kernel ran them decomposed into" in text
    assert " CMPNE " in text and " MAX " not in text      # the listing is the decomposed one
    assert "source rendered by cmpne-nan:" in text
    fake_backends({"cmpne-nan": "broken_backends:cmpne_backend"})
    assert cli.main(["replay", path, "--backend", "cmpne-nan", "--show"]) == 1
    out = capsys.readouterr().out
    assert out.index("source rendered by cmpne-nan:") < out.index("fails")
    assert f"kernel {kc.kernel.name} grid" in out


def test_a_case_that_passes_again_removes_its_stale_reproduction_file(broken, tmp_path):
    from portkit.reference_backends import interpreter

    _run(broken.sin_off(), tmp_path, tiers=(2,), pattern="ops/SIN/float32")
    stale = tmp_path / "ops_SIN_float32.json"
    assert stale.is_file()
    _run(interpreter.backend.load(), tmp_path, tiers=(2,), pattern="ops/SIN/float32")
    assert stale.is_file()      # another backend's file stays
    fixed = Target(interpreter.backend.load(), name="broken-sin")
    report = run(fixed, Options(tiers=(2,), quick=True, pattern="ops/SIN/float32",
                                repro_dir=str(tmp_path)))
    assert _result(report, "ops/SIN/float32").status is Status.PASSED
    assert not stale.exists()
