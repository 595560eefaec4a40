"""The code style we keep, enforced: ruff clean (its rules and line length in pyproject.toml), and
no module so long that it should be split."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    result = subprocess.run([ruff, "check", "--no-cache", str(ROOT)], capture_output=True, check=False,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "portkit").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, f"split these by concern: {long}"
