"""ONNX's own single-node tests on the CPU reference, held to docs/onnx-node-tests.md: a test
not listed there must pass, and a listed one must still not pass for the reason given (so the
stated pass rate is the true one). Regenerate the page after a change:

    python -m portkit.onnx.node_tests --device cpu --markdown docs/onnx-node-tests.md
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")

from portkit.onnx.node_tests import compile_ahead, op_of, run_case, standard_cases

PAGE = Path(__file__).parents[2] / "docs" / "onnx-node-tests.md"
ROW = re.compile(r"^\| (test_\w+) \| (failed|error|unsupported) \| (.*) \|$")


def documented() -> dict[str, tuple[str, str]]:
    """test name -> (status, why) for every test the page says does not pass."""
    return {m[1]: (m[2], m[3]) for line in PAGE.read_text().splitlines()
            if (m := ROW.match(line))}


CASES = standard_cases()
BY_OP: dict[str, list] = {}
for _case in CASES:
    BY_OP.setdefault(op_of(_case), []).append(_case)


def test_the_page_counts_every_test():
    first = PAGE.read_text().splitlines()[0]
    assert first.startswith(f"{len(CASES)} standard-dtype node tests on `cpu`"), first
    assert set(documented()) <= {c.name for c in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(BY_OP))
def test_node_tests_pass_as_documented(op):
    expected = documented()
    wrong = []
    compile_ahead(BY_OP[op], "cpu")
    for case in BY_OP[op]:
        result = run_case(case, "cpu")
        status = expected.get(case.name, ("passed", ""))[0]
        if result.status != status:
            wrong.append(f"{case.name}: {result.status} ({result.detail}), the page says {status}")
    assert not wrong, "\n".join(wrong) + "\nregenerate docs/onnx-node-tests.md (see above)"


def test_the_guide_states_the_pages_rates():
    page = PAGE.read_text().splitlines()
    guide = (PAGE.parent / "onnx.md").read_text()
    rows = [line for line in page if re.match(r"^\| \w+ \| \d+ \| \d+ \| [\d.]+% \|$", line)]
    assert rows, "the page has no table of categories"
    stale = [row for row in rows if row not in guide]
    assert not stale, f"docs/onnx.md lacks these rows of the page's category table: {stale}"
    passed, rate = re.search(r"\*\*(\d+) passed \(([\d.]+%)\)\*\*", page[0]).groups()
    assert f"{int(passed):,} of the {len(CASES):,} pass on cpu ({rate})" in guide
