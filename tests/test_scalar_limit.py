"""Capabilities.max_scalars bounds the scalar arguments of every launch (ABI 0.7), and a device
that sets Device.signed_program gets each kernel's Signature when it makes the Program."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import backends, runtime, schedule
from portkit.abi import CapabilityError, KernelBuilder, Op, Signature, dtypes
from portkit.tensor import Tensor


def _device(name: str, **changes) -> runtime.Runtime:
    device = backends.load("cpu")
    caps = dataclasses.replace(device.capabilities, max_scalars=4)
    try:
        return runtime.register(runtime.Runtime(name, dataclasses.replace(
            device, name=name, capabilities=caps, **changes)))
    except ValueError:      # registered by an earlier test in this process
        return runtime.get(name)


def _with_vars(count: int):
    b = KernelBuilder("many_vars")
    out = b.param(dtypes.int32)
    total = b.const(0)
    for k in range(count):
        total = b.alu(Op.ADD, total, b.var(f"v{k}"))
    b.store(out, b.const(0), total)
    return b.build()


def test_a_kernel_with_more_scalars_than_declared_is_refused_naming_the_limit():
    caps = _device("cpu-4-scalars").capabilities
    caps.check_launch(_with_vars(4))
    with pytest.raises(CapabilityError, match=r"5 scalar arguments exceed the limit of 4"):
        caps.check_launch(_with_vars(5))


def test_the_scheduler_keeps_a_kernel_within_the_scalar_limit():
    rt = _device("cpu-4-scalars")
    x = np.arange(8, dtype=np.float32)
    t = Tensor(x, device=rt.name)
    y = ((t * 3.0 + 5.0) * 7.0 - 11.0) / 13.0 + 17.0
    kernel, = schedule.kernels([y.lazy])
    assert 0 < len(kernel.vars) <= 4
    np.testing.assert_allclose(y.numpy(), ((x * 3 + 5) * 7 - 11) / 13 + 17, rtol=1e-6)


def test_a_signed_program_gets_the_kernels_signature():
    seen: list[Signature] = []
    plain = backends.load("cpu").program

    def signed(name: str, binary: bytes, signature: Signature):
        seen.append(signature)
        return plain(name, binary)

    rt = _device("cpu-signed", signed_program=signed)
    b = KernelBuilder("signed")
    out, x = b.param(dtypes.float32), b.param(dtypes.int32)
    b.store(out, b.const(0), b.var("scale", dtypes.float32))
    b.store(x, b.const(0), b.load(x, b.const(0)))
    result, _ = rt.run(b.build(), np.zeros(1, np.float32), np.ones(1, np.int32),
                       scalars=(2.5,))
    assert result[0] == 2.5
    assert seen == [Signature((dtypes.float32, dtypes.int32), frozenset({0, 1}),
                              (dtypes.float32,))]
