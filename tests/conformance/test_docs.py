"""docs/conformance.md must show the budgets the code enforces, and name every status and tier."""
from pathlib import Path

from portkit.abi import spec
from portkit.abi.ops import Op
from portkit.conformance import Status, suite

DOC = (Path(__file__).parents[2] / "docs" / "conformance.md").read_text()


def test_budget_table_equals_spec():
    rows = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] in Op.__members__ and len(cells) == 6:
            rows[cells[0]] = cells
    assert set(rows) == set(spec.budget_table())
    for name, budgets in spec.budget_table().items():
        cells = rows[name]
        for column, dtype in enumerate(("float16", "bfloat16", "float32", "float64"), 1):
            assert float(cells[column]) == budgets[dtype], (name, dtype)
        assert (cells[5] == "absolute") == spec.SPECS[Op[name]].atol_near_zero


def test_every_status_and_tier_is_documented():
    for status in Status:
        assert f"| {status.value} |" in DOC
    for number in suite.TIERS:
        assert f"| {number} |" in DOC
