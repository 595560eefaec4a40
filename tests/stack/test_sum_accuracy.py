"""Sums and matmuls keep their accuracy on every backend: float32 sums are blocked (no long chain
of additions into one register) and float16 ones accumulate in float32, as torch does."""
import numpy as np
import pytest

from portkit.abi import dtypes
from portkit.tensor import Tensor


def _relative(got, exact) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - exact) / np.abs(exact)))


def _needs(capabilities, dtype) -> None:
    if dtype not in capabilities.dtypes:
        pytest.skip(f"the backend declares no {dtype.name}")


def test_float32_sum_of_a_million_tenths(backend):
    x = np.full(10**6, 0.1, np.float32)
    exact = x.astype(np.float64).sum()
    got = Tensor(x).sum().numpy()
    # sequential float32 accumulation gave 99985.0 (1.5e-4 off), numpy's pairwise 100000.01
    assert _relative(got, exact) <= 1e-6, f"sum {float(got)!r}, exact {exact!r}"


def test_float32_row_sums_of_odd_length(backend):
    # a length that is no multiple of the partial sums: the tail loop adds the rest
    x = np.full((3, 20_011), 0.1, np.float32)
    exact = x.astype(np.float64).sum(axis=1)
    got = Tensor(x).sum(axis=1).numpy()
    assert _relative(got, exact) <= 1e-6, f"sums {got!r}, exact {exact!r}"


def test_float16_sum_accumulates_in_float32(backend, capabilities):
    _needs(capabilities, dtypes.float16)
    x = np.full(4096, 0.1, np.float16)
    exact = x.astype(np.float64).sum()
    got = Tensor(x).sum()
    assert got.dtype == dtypes.float16
    # float16 accumulation stalls at 402.5 (a float16 step of 0.25 swallows most of 0.1)
    assert _relative(got.numpy(), exact) <= 1e-3, f"sum {float(got.numpy())!r}, exact {exact}"


def test_float16_matmul_accumulates_in_float32(backend, capabilities):
    _needs(capabilities, dtypes.float16)
    rng = np.random.default_rng(0)
    a = rng.random((8, 512)).astype(np.float16)
    b = rng.random((512, 24)).astype(np.float16)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    got = (Tensor(a) @ Tensor(b)).numpy()
    assert got.dtype == np.float16
    # positive terms, so no cancellation: float16 accumulation was 7e-3 off, float32 5e-4
    assert _relative(got, exact) <= 1e-3
