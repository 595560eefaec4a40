"""The oracle itself: the spec's rules where C, numpy and IEEE differ, and its comparisons."""
import math

import numpy as np
import pytest

from portkit.abi import dtypes, spec
from portkit.abi.ops import Op


def ev(op, *args, dtype=None):
    return spec.evaluate(op, *args, dtype=dtype)


def test_integer_division_truncates_and_mod_takes_the_sign_of_a():
    a, b = np.array([-7, 7, -7, 7], np.int32), np.array([2, -2, -2, 2], np.int32)
    assert list(ev(Op.IDIV, a, b)[0]) == [-3, -3, 3, 3]
    assert list(ev(Op.MOD, a, b)[0]) == [-1, 1, -1, 1]


def test_division_by_zero_and_min_over_minus_one_are_undefined():
    a = np.array([5, -2**31, -2**31, 3], np.int32)
    b = np.array([0, -1, 1, 2], np.int32)
    assert list(spec.valid(Op.IDIV, a, b)) == [False, False, True, True]
    assert list(spec.valid(Op.MOD, a.astype(np.uint32), b.astype(np.uint32))) == [
        False, True, True, True]


def test_integers_wrap():
    big = np.array([2**31 - 1], np.int32)
    assert ev(Op.ADD, big, np.array([1], np.int32))[0][0] == -2**31
    assert ev(Op.NEG, np.array([-2**31], np.int32))[0][0] == -2**31
    assert ev(Op.NEG, np.array([3], np.uint8))[0][0] == 253


def test_shifts_arithmetic_for_signed_logical_for_unsigned_and_bounded():
    assert ev(Op.SHR, np.array([-8], np.int32), np.array([1], np.int32))[0][0] == -4
    assert ev(Op.SHR, np.array([0x80], np.uint8), np.array([7], np.uint8))[0][0] == 1
    assert ev(Op.SHL, np.array([0x81], np.uint8), np.array([1], np.uint8))[0][0] == 2
    assert list(spec.valid(Op.SHL, np.array([1, 1, 1], np.int8), np.array([-1, 7, 8], np.int8))
                ) == [False, True, False]


def test_max_and_comparisons_with_nan():
    nan, one = np.array([np.nan], np.float32), np.array([1.0], np.float32)
    assert np.isnan(ev(Op.MAX, one, nan)[0][0]) and np.isnan(ev(Op.MAX, nan, one)[0][0])
    assert not ev(Op.CMPLT, nan, one)[0][0] and ev(Op.CMPNE, nan, nan)[0][0]


def test_casts_to_bool_int_and_float():
    x = np.array([np.nan, 0.0, -0.0, 2.7, -2.7], np.float32)
    assert list(ev(Op.CAST, x, dtype=dtypes.bool_)[0]) == [True, False, False, True, True]
    assert list(ev(Op.CAST, x[3:], dtype=dtypes.int8)[0]) == [2, -2]
    assert list(spec.valid(Op.CAST, np.array([127.9, 128.0], np.float32), dtype=dtypes.int8)
                ) == [True, False]
    assert ev(Op.CAST, np.array([70000.0], np.float32), dtype=dtypes.float16)[0][0] == np.inf
    assert ev(Op.CAST, np.array([300], np.int32), dtype=dtypes.uint8)[0][0] == 44


@pytest.mark.parametrize("op", [Op.CAST, Op.BITCAST])
def test_conversions_without_a_dtype_say_so(op):
    x = np.array([1.5], np.float32)
    with pytest.raises(ValueError, match="pass dtype="):
        ev(op, x)
    with pytest.raises(ValueError, match="pass dtype="):
        spec.valid(Op.CAST, x)
    assert ev(Op.BITCAST, x, dtype=dtypes.int32)[0][0] == 0x3FC00000


def test_float_ops_round_once_from_float64():
    a = np.array([1.0], np.float16)
    b = np.array([2.0 ** -11], np.float16)     # exactly half an ULP of 1.0: ties to even
    assert ev(Op.ADD, a, b)[0][0] == 1.0
    assert ev(Op.ADD, a, b * 3)[0][0] == np.float16(1.0 + 2.0 ** -9)


def test_mulacc_accepts_fused_and_unfused():
    a = np.array([1 + 2.0 ** -12], np.float32)
    c = np.array([-1.0], np.float32)
    fused, unfused = ev(Op.MULACC, a, a, c)
    assert fused[0] == np.float32(2.0 ** -11 + 2.0 ** -24) and unfused[0] == np.float32(2 ** -11)


def test_ulp_distance_counts_representable_values_across_zero():
    x = np.array([1.0, 0.0, -0.0, np.nan, np.nan], np.float32)
    y = np.array([np.nextafter(np.float32(1), np.float32(2)), -0.0, np.float32(1e-45), np.nan,
                  1.0], np.float32)
    assert list(spec.ulp_distance(x, y)) == [1, 0, 1, 0, math.inf]


@pytest.mark.parametrize("op, dtype, ulps", [(Op.SIN, "float32", 4), (Op.FDIV, "float32", 2.5),
                                             (Op.SQRT, "float16", 1.5), (Op.ADD, "float32", 0)])
def test_budgets_start_from_opencl_full_profile(op, dtype, ulps):
    assert spec.budget(op, dtypes.by_name(dtype)) == ulps
    assert spec.budget(op, dtypes.int32) == 0


def test_within_budget_uses_ulps_then_the_absolute_fallback_near_zero():
    expected = (np.array([1.0, 1e-30], np.float32),)
    five_ulp = np.float32(1.0) + 5 * np.finfo(np.float32).eps
    actual = np.array([five_ulp, 2e-30], np.float32)
    ok, err = spec.within_budget(Op.SIN, dtypes.float32, actual, expected)
    assert list(ok) == [False, True] and err[0] == 5      # 1e-30 off: tiny in absolute terms
    ok, _ = spec.within_budget(Op.FDIV, dtypes.float32, actual, expected)
    assert list(ok) == [False, False]                     # FDIV has no absolute fallback
    ok, _ = spec.within_budget(Op.ADD, dtypes.int32, np.array([1, 2]), (np.array([1, 3]),),
                               mask=np.array([True, False]))
    assert ok.all()                                       # masked out: never compared


def test_flush_denormals_keeps_the_sign():
    tiny = np.array([1e-40, -1e-40, 1e-30], np.float32)
    flushed = spec.flush_denormals(tiny)
    assert list(flushed) == [0, 0, np.float32(1e-30)] and np.signbit(flushed[1])
