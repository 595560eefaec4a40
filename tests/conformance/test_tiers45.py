"""Tiers 4 (Tensor ops) and 5 (models): they pass on the reference backends, pin a broken op on
the right Tensor cases (blocked behind tier 2, or failed with the worst element when run alone),
and report a dtype the backend lacks as unsupported."""
import numpy as np
import pytest

from portkit.conformance import Options, Status, Target, run, tensor_ops


def _run(target, tmp_path, tiers, **options):
    return run(target, Options(tiers=tiers, repro_dir=str(tmp_path), **options))


def _result(report, case_id):
    [result] = [r for r in report.results if r.case.id == case_id]
    return result


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_tier4_quick_passes_on_reference_backends(backend, tmp_path):
    report = _run(Target.load(backend), tmp_path, (4,), quick=True)
    assert report.tiers["tensor"]["status"] == "run"
    ids = [r.case.id for r in report.results]
    assert "tensor/matmul/float32/fwd" in ids and "tensor/layernorm/float32/bwd" in ids
    bad = [(r.case.id, r.message) for r in report.results if r.status is not Status.PASSED]
    assert not bad
    matmul = _result(report, "tensor/matmul/float32/bwd")
    assert matmul.max_error is not None and 0 < matmul.max_error < 1e-4


def test_tier4_full_covers_dtypes_on_cpu(tmp_path):
    report = _run(Target.load("cpu"), tmp_path, (4,), pattern="tensor/matmul/")
    statuses = {r.case.id: r.status for r in report.results}
    assert set(statuses) == {f"tensor/matmul/{d}/{way}" for d in ("float32", "float16", "float64")
                             for way in ("fwd", "bwd")}
    assert set(statuses.values()) == {Status.PASSED}


def test_gradient_of_a_movement_is_where_the_elements_came_from():
    x, w = np.zeros((2, 3)), np.arange(6.0).reshape(3, 2)
    assert np.array_equal(tensor_ops.movement_vjp(lambda i: i.T, x, w), w.T)
    padded = tensor_ops.movement_vjp(lambda i: np.pad(i, 1), x, np.ones((4, 5)))
    assert np.array_equal(padded, np.ones((2, 3)))      # padding sends no gradient back


def test_sin_off_by_1e3_blocks_the_tensor_cases_that_use_sin(broken, tmp_path):
    report = _run(Target(broken.sin_off()), tmp_path, (1, 2, 4), quick=True)
    assert _result(report, "ops/SIN/float32").status is Status.FAILED
    sin = _result(report, "tensor/sin/float32/fwd")
    assert sin.status is Status.BLOCKED and "ops/SIN/float32 (failed)" in sin.message
    # Tensor ops whose kernels never use SIN run, on the broken device, and pass.
    assert _result(report, "tensor/matmul/float32/bwd").status is Status.PASSED
    assert _result(report, "tensor/softmax/float32/fwd").status is Status.PASSED


def test_sin_off_by_1e3_fails_tier4_alone_with_the_worst_element(broken, tmp_path):
    report = _run(Target(broken.sin_off()), tmp_path, (4,), pattern="tensor/sin/")
    fwd, bwd = (_result(report, f"tensor/sin/float32/{way}") for way in ("fwd", "bwd"))
    assert fwd.status is Status.FAILED and bwd.status is Status.FAILED
    assert "out: " in fwd.message and "worst at out[" in fwd.message and "ULP" in fwd.message
    assert "the CPU reference passes this case" in fwd.message
    assert "grad x0" in bwd.message and "(bound " in bwd.message
    assert fwd.replay == "portkit conform --backend broken-sin --tier 4 -k tensor/sin/float32/fwd"


def test_a_dtype_the_backend_lacks_is_unsupported(broken, tmp_path):
    report = _run(Target(broken.no_float16()), tmp_path, (4,), pattern="tensor/permute/")
    assert _result(report, "tensor/permute/float16/fwd").status is Status.UNSUPPORTED
    assert "float16" in _result(report, "tensor/permute/float16/bwd").message
    assert _result(report, "tensor/permute/float32/fwd").status is Status.PASSED


def test_tier5_mlp_and_cnn_agree_with_the_cpu_reference(tmp_path):
    report = _run(Target.load("cpu"), tmp_path, (5,), quick=True, pattern="models/[mc]*")
    assert [r.case.id for r in report.results] == ["models/mlp-sgd/float32",
                                                   "models/cnn/float32"]
    for result in report.results:
        assert result.status is Status.PASSED, result.message
        assert "of its bound" in result.message and result.max_error > 0


@pytest.mark.slow
def test_tier5_transformer_block_agrees_on_the_interpreter(tmp_path):
    report = _run(Target.load("interpreter"), tmp_path, (5,), quick=True,
                  pattern="models/transformer")
    [result] = report.results
    assert result.status is Status.PASSED, result.message


def test_tier5_is_blocked_by_a_failed_tensor_op(broken, tmp_path):
    report = _run(Target(broken.max_nan()), tmp_path, (1, 2, 4, 5), quick=True,
                  pattern="[!k]*")     # every tier but 3 (kernels/...), to keep it short
    pool = _result(report, "tensor/max-axis/float32/fwd")
    assert pool.status is Status.BLOCKED and "ops/MAX/float32" in pool.message
    cnn = _result(report, "models/cnn/float32")
    assert cnn.status is Status.BLOCKED and "tensor/" in cnn.message


def test_tier4_kernels_compile_ahead_in_batches(tmp_path, monkeypatch):
    from portkit.reference_backends.cpu import backend
    from portkit.runtime import Runtime

    one_by_one = []
    build = Runtime.build
    monkeypatch.setattr(Runtime, "build", lambda self, kernel, disk_cache=True: (
        one_by_one.append(kernel.name), build(self, kernel, disk_cache))[1])
    batches = []
    compile_all = Runtime.compile_all

    def counted(self, kernels, *args, **kwargs):
        kernels = list(kernels)     # the runner hands over a generator: lowered as compiled
        batches.append(len(kernels))
        return compile_all(self, kernels, *args, **kwargs)
    monkeypatch.setattr(Runtime, "compile_all", counted)
    # a device of its own, so that no kernel of another test is compiled already
    report = _run(Target(backend.load()), tmp_path, (4,), quick=True,
                  pattern="tensor/[ls]*/float32/*", isolate="none")
    assert len(report.results) > 4
    assert {r.status for r in report.results} == {Status.PASSED}
    assert one_by_one == []             # every kernel the cases ran was compiled ahead
    assert max(batches) > 4


def test_tier4_kernels_compile_ahead_in_a_worker_process(tmp_path):
    compiled = []
    report = run(Target.load("cpu"), Options(tiers=(4,), repro_dir=str(tmp_path), quick=True,
                                             pattern="tensor/[ls]*/float32/*",
                                             isolate="process"),
                 compiling=lambda done, total: compiled.append(total))
    assert {r.status for r in report.results} == {Status.PASSED}
    assert compiled and compiled[-1] > 4    # the worker compiled the cases' kernels ahead
