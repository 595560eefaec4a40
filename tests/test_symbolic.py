"""portkit/symbolic.py: every simplified index expression equals plain integer arithmetic, and
its range [min, max] holds every value it takes."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from portkit.symbolic import Bound, Div, Lin, Var, bounds, const, recombine, unravel, var


def evaluate(expr: Lin, env: dict[str, int]) -> int:
    """The expression's value with each variable set from `env`."""
    def atom(a) -> int:
        if isinstance(a, Var):
            return env[a.name]
        inner = evaluate(a.expr, env)
        return inner // a.divisor if isinstance(a, Div) else inner % a.divisor
    return expr.const + sum(coef * atom(a) for a, coef in expr.terms)


def assignments(ranges: dict[str, tuple[int, int]]):
    names = list(ranges)
    for values in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges.values())):
        yield dict(zip(names, values))


forms = st.tuples(st.integers(-6, 6), st.integers(-6, 6), st.integers(-20, 20),
                  st.integers(1, 12), st.integers(0, 3), st.integers(1, 9))


@settings(max_examples=300, deadline=None)
@given(forms)
def test_floordiv_and_mod_match_python(form):
    a, b, c, divisor, lo, span = form
    ranges = {"x": (lo, lo + span), "y": (0, 3)}
    expr = var("x", *ranges["x"]) * a + var("y", *ranges["y"]) * b + c
    for env in assignments(ranges):
        plain = a * env["x"] + b * env["y"] + c
        for got, want in ((expr // divisor, plain // divisor), (expr % divisor, plain % divisor)):
            assert evaluate(got, env) == want
            assert got.min <= want <= got.max


def test_div_mod_fold_by_range_to_plain_indexing():
    i, j = var("i", 0, 7), var("j", 0, 3)
    assert (i * 4 + j) // 4 == i
    assert (i * 4 + j) % 4 == j
    assert (i // 2) // 4 == i // 8
    assert (i * 6) % 4 == (i * 3 % 2) * 2           # gcd taken out
    assert var("k", 5, 5) == const(5)                # a one-value variable is a constant


def test_unravel_then_recombine_gives_back_the_flat_index():
    flat = var("f", 0, 59)
    parts = unravel(flat, (3, 4, 5))
    for env in assignments({"f": (0, 59)}):
        assert [evaluate(p, env) for p in parts] == list(divmod(env["f"] // 5, 4)) + [env["f"] % 5]
    assert recombine(parts[0] * 20 + parts[1] * 5 + parts[2]) == flat


def test_bounds_keep_only_what_range_analysis_cannot_decide():
    i = var("i", 0, 9)
    always, never, maybe = Bound(i, 0, 10), Bound(i, 10, 12), Bound(i, 2, 5)
    assert bounds([always, maybe]) == (maybe,)
    assert bounds([maybe, never]) is None
    assert bounds([Bound(i, 3, 3)]) is None


def test_a_row_of_a_grid_of_rows_divides_without_its_columns():
    # row 8*r + 1 of a (16, 35) grid of 2000-long rows, at column 16*c: the constant's
    # multiple of 2000 goes with the row, so the column drops out of the row's quotient and
    # the flat index recombines to 2000 * row + column (a cross-entropy over 560 x 2000
    # logits divided every element's position by 70000)
    r, c = var("r", 0, 69), var("c", 0, 124)
    flat = r * 16000 + c * 16 + 2000
    row = r * 8 + 1
    assert flat // 70000 == row // 35 and flat // 2000 % 35 == row % 35
    back = recombine(flat // 70000 * 70000 + flat // 2000 % 35 * 2000 + flat % 2000)
    assert (dict(back.terms), back.const) == (dict(flat.terms), flat.const)
