"""docs/abi.md must agree with the code: ops, dtypes, required/optional, spec texts, budgets."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from portkit.abi import ABI_VERSION, dtypes, spec
from portkit.abi.ops import COMPUTE, OPTIONAL, REQUIRED, STRUCTURAL, Op
from portkit.codegen.decompose import SIN_ACCURATE_TO

DOC = Path(__file__).parents[2] / "docs" / "abi.md"
BUDGET_ORDER = ("float16", "bfloat16", "float32", "float64")


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table as rows of cells (header first, separator row dropped)."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip().replace("\\|", "|")
                     for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    return found


def rows_by_op(header_word: str) -> dict[str, list[dict[str, str]]]:
    """Rows of the tables whose header has `header_word`, keyed by the op in their first cell."""
    rows: dict[str, list[dict[str, str]]] = {}
    for table in tables(DOC.read_text()):
        header = table[0]
        if header_word not in header:
            continue
        for row in table[1:]:
            rows.setdefault(row[0].strip("`"), []).append(dict(zip(header, row)))
    return rows


def budget_cell(op: Op) -> str:
    table = spec.budget_table().get(op.name)
    return " / ".join(f"{table[d]:g}" for d in BUDGET_ORDER) if table else "exact"


def test_every_op_and_dtype_is_named() -> None:
    text = DOC.read_text()
    missing = [f"`{op.name}`" for op in Op if f"`{op.name}`" not in text]
    missing += [f"`{d.name}`" for d in dtypes.ALL if not re.search(rf"`{d.name}`", text)]
    assert not missing, f"docs/abi.md never mentions {missing}"


def test_the_documented_version_is_the_code_version() -> None:
    assert f"ABI version **{ABI_VERSION}**" in DOC.read_text(), (
        f"docs/abi.md must say 'ABI version **{ABI_VERSION}**' (portkit.abi.ABI_VERSION)")


@pytest.mark.parametrize("op", COMPUTE, ids=[op.name for op in COMPUTE])
def test_each_compute_op_row_matches_the_spec(op: Op) -> None:
    rows = rows_by_op("ULP").get(op.name, [])
    assert len(rows) == 1, f"{op.name} needs exactly one row in the op tables, has {len(rows)}"
    row = rows[0]
    assert row["Kind"] == ("optional" if op in OPTIONAL else "required"), row["Kind"]
    assert row["Meaning (spec)"] == spec.SPECS[op].text, "copy the text from portkit/abi/spec.py"
    assert row["ULP"] == budget_cell(op), (
        f"{op.name}: the doc says {row['ULP']!r}, spec.budget_table() says {budget_cell(op)!r}")
    assert len(row) == 9, f"{op.name}: a row needs all five targets"


def test_every_structural_node_has_a_row() -> None:
    rows = rows_by_op("Node")
    assert sorted(rows) == sorted(op.name for op in STRUCTURAL)


def test_required_and_optional_counts_and_rewrites() -> None:
    text = DOC.read_text()
    assert f"the {len(REQUIRED)} **required**" in text
    assert f"The {len(OPTIONAL)} **optional**" in text
    assert sorted(rows_by_op("Rewrite")) == sorted(op.name for op in OPTIONAL)
    sin = rows_by_op("Rewrite")["SIN"][0]["Accuracy"]
    for dtype in ("float32", "float64"):
        bound = f"{SIN_ACCURATE_TO[dtype]:.0e}".replace("e+0", "e")
        assert bound in sin, f"the doc's SIN range must say {bound} for {dtype}"
