"""The code style of STYLE.md, enforced: ruff (rules and line length in pyproject.toml) is clean."""
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
