"""The launch path of portkit.runtime: launch_again (the replays' launch) and the settings
PORTKIT_DEBUG and PORTKIT_CHECK that make every launch printed or checked; the checked launch's
fault buffer; scalar packing; programs that keep their last launch's arrays; read-back."""
from __future__ import annotations

import numpy as np
import pytest

from portkit import runtime, settings
from portkit.abi import BackendUnavailable, KernelBuilder, Op, dtypes
from portkit.abi.kernel import scalar_words


@pytest.fixture(autouse=True)
def quiet(monkeypatch):
    monkeypatch.delenv("PORTKIT_DEBUG", raising=False)
    monkeypatch.delenv("PORTKIT_CHECK", raising=False)


def _store_at_group(grid: int, name: str = "store_at_group"):
    """out[group] = 1: out of bounds where the buffer is shorter than the grid."""
    k = KernelBuilder(name)
    out = k.param(dtypes.float32)
    k.store(out, k.special("group", 0), k.const(1.0, dtypes.float32))
    return k.build(grid=(grid, 1, 1))


def test_launch_again_runs_the_kernel():
    rt = runtime.get("cpu")
    out = rt.alloc(dtypes.float32, 8).copyin(np.zeros(8, np.float32))
    rt.launch_again(rt.compile(_store_at_group(8)), [out], ())
    np.testing.assert_array_equal(out.numpy(), np.ones(8, np.float32))


def test_launch_again_prints_each_launch_under_portkit_debug(monkeypatch, capsys):
    rt = runtime.get("cpu")
    compiled = rt.compile(_store_at_group(8, "again_debug"))
    out = rt.alloc(dtypes.float32, 8)
    rt.launch_again(compiled, [out], ())
    assert "again_debug" not in capsys.readouterr().err
    monkeypatch.setenv("PORTKIT_DEBUG", "2")
    rt.launch_again(compiled, [out], ())
    rt.launch_again(compiled, [out], ())
    assert capsys.readouterr().err.count("again_debug ") == 2


def test_launch_again_is_bounds_checked_under_portkit_check(monkeypatch):
    rt = runtime.get("cpu")
    compiled = rt.compile(_store_at_group(20))
    short = rt.alloc(dtypes.float32, 16).copyin(np.zeros(16, np.float32))
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    with pytest.raises(runtime.OutOfBoundsError, match=r"element 1[6-9] of a 16-element"):
        rt.launch_again(compiled, [short], ())
    np.testing.assert_array_equal(short.numpy(), np.ones(16, np.float32))


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
def test_checked_launches_share_one_fault_buffer_cleared_after_a_fault(monkeypatch, device):
    rt = runtime.get(device)
    compiled = rt.compile(_store_at_group(20, "one_fault_buffer"))
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    wide, short = rt.alloc(dtypes.float32, 20), rt.alloc(dtypes.float32, 16)
    rt.launch(compiled, [wide])             # builds the checked kernel and its fault buffer
    allocated = []
    monkeypatch.setattr(rt.pool, "take", lambda nbytes: allocated.append(nbytes) or
                        np.zeros(nbytes, np.uint8))
    for _ in range(3):
        rt.launch(compiled, [wide])
    with pytest.raises(runtime.OutOfBoundsError):
        rt.launch(compiled, [short])
    rt.launch(compiled, [wide])             # the fault found before is not reported again
    assert allocated == []


def test_setting_follows_the_environment_as_it_changes(monkeypatch):
    monkeypatch.delenv("PORTKIT_DEVICE", raising=False)
    assert settings.raw("PORTKIT_DEVICE") == "" and settings.read("PORTKIT_DEVICE") == "cpu"
    monkeypatch.setenv("PORTKIT_DEVICE", "värde 1")
    assert settings.read("PORTKIT_DEVICE") == "värde 1"
    monkeypatch.setenv("PORTKIT_DEBUG", "3")
    assert settings.read("PORTKIT_DEBUG") == 3
    monkeypatch.setenv("PORTKIT_CHECK", "interpreter")
    assert settings.read("PORTKIT_CHECK") == "interpreter"
    assert settings.launch() == (3, "interpreter")
    monkeypatch.delenv("PORTKIT_DEVICE")
    assert settings.raw("PORTKIT_DEVICE") == ""


def _store_scalars():
    """out[group] = a + b * 100, a and b int32 scalars."""
    k = KernelBuilder("store_scalars")
    out = k.param(dtypes.int32)
    value = k.alu(Op.ADD, k.var("a"), k.alu(Op.MUL, k.var("b"), k.const(100)))
    k.store(out, k.special("group", 0), value)
    return k.build(grid=(4, 1, 1))


@pytest.mark.parametrize("device", ["cpu", "interpreter", "opencl", "webgpu"])
def test_a_program_takes_each_launchs_own_scalars_and_grid(device):
    """Programs may keep the arrays of their last launch's arguments (the CPU's do): each
    launch must still run on its own scalars, grid and buffers."""
    try:
        rt = runtime.get(device)
    except BackendUnavailable as error:
        pytest.skip(f"{device} is not available here: {error}")
    program = rt.compile(_store_scalars()).program
    out = [rt.alloc(dtypes.int32, 4).copyin(np.zeros(4, np.int32)) for _ in range(2)]
    words = [1, 2]      # one list changed in place between launches, as a replay's are
    launches = [(1, 2, 4, 0, [201] * 4),        # scalars, grid, buffer, what it then holds
                (1, 2, 4, 1, [201] * 4),
                (3, 2, 4, 0, [203] * 4),
                (3, 2, 2, 1, [203] * 2 + [201] * 2),
                (0, 5, 4, 0, [500] * 4)]
    for a, b, grid, target, want in launches:
        words[:] = a, b
        program([out[target].handle], words, (grid, 1, 1), (1, 1, 1), wait=True)
        np.testing.assert_array_equal(out[target].numpy(), want)


def _vars(*var_dtypes):
    """out[k] = the bits of scalar k."""
    k = KernelBuilder("vars_" + "_".join(d.name for d in var_dtypes))
    out = k.param(dtypes.int32)
    for position, dtype in enumerate(var_dtypes):
        k.store(out, k.const(position), k.cast(k.var(f"v{position}", dtype), dtypes.int32,
                                               bitcast=True))
    return k.build()


@pytest.mark.parametrize("values", [(0.5, 7, 3), (-0.0, -1, 2**32 - 1), (float("nan"), 0, 0),
                                    (float("inf"), 2**31 - 1, 2**32 + 5), (1e40, -2**31, -1),
                                    (float(2**-149), 0, 2**31)])
def test_compiled_words_are_scalar_words(values):
    """Compiled.words packs with formats made once; its words are scalar_words' exactly."""
    var_dtypes = (dtypes.float32, dtypes.int32, dtypes.uint32)
    rt = runtime.get("cpu")
    compiled = rt.compile(_vars(*var_dtypes))
    assert compiled.words(values) == scalar_words(var_dtypes, values)
    out = rt.alloc(dtypes.int32, 3)
    rt.launch(compiled, [out], values)
    assert out.numpy().tolist() == scalar_words(var_dtypes, values)


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
def test_a_host_buffers_numpy_is_a_copy_of_its_elements(device):
    rt = runtime.get(device)
    buffer = rt.alloc(dtypes.bfloat16, 3).copyin(np.arange(3).astype(dtypes.bfloat16.np))
    first = buffer.numpy()
    assert first.dtype == dtypes.bfloat16.np and first.shape == (3,) and first.flags.writeable
    first[:] = 7
    np.testing.assert_array_equal(buffer.numpy(), np.arange(3).astype(dtypes.bfloat16.np))
