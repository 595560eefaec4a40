"""One settings table: every PORTKIT_* variable is declared once in portkit/settings.py, read
through it, and listed in docs/settings.md from the table."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from portkit import settings

ROOT = Path(__file__).parents[1]
# os.environ outside the settings module, each for another program's variable
FOREIGN = {
    "portkit/reference_backends/webgpu/runtime.py": "sets XDG_RUNTIME_DIR for Mesa's driver",
    "portkit/reference_backends/opencl/runtime.py": "reads PoCL's POCL_CACHE_DIR",
    "portkit/reference_backends/cpu/runtime.py": "reads OMP_NUM_THREADS, as OpenMP does",
}


def test_the_settings_page_is_generated_from_the_table():
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings.markdown(), "run: python -m portkit.settings > docs/settings.md"


def test_every_portkit_variable_named_anywhere_is_declared():
    named = set()
    for path in [*(ROOT / "portkit").rglob("*.py"), *(ROOT / "docs").rglob("*.md"),
                 ROOT / "README.md"]:
        named |= set(re.findall(r"\bPORTKIT_[A-Z_]+[A-Z]\b", path.read_text()))
    assert named - set(settings.SETTINGS) == set(), "declare these in portkit/settings.py"


def test_only_the_settings_module_reads_the_environment():
    readers = {str(p.relative_to(ROOT)) for p in (ROOT / "portkit").rglob("*.py")
               if "os.environ" in p.read_text() or "getenv" in p.read_text()}
    assert readers == {"portkit/settings.py", *FOREIGN}


@pytest.mark.parametrize("name", ["PORTKIT_BEAM", "PORTKIT_CACHE_MAX_MB", "PORTKIT_POOL_MB",
                                  "PORTKIT_KERNEL_CACHE", "PORTKIT_DEBUG", "PORTKIT_CHECK"])
def test_a_value_a_setting_cannot_read_names_the_setting(monkeypatch, name):
    monkeypatch.setenv(name, "lots")
    with pytest.raises(ValueError, match=name):
        settings.read(name)


def test_unset_or_empty_is_the_default(monkeypatch):
    monkeypatch.delenv("PORTKIT_POOL_MB", raising=False)
    assert settings.megabytes("PORTKIT_POOL_MB") == 256 << 20
    monkeypatch.setenv("PORTKIT_POOL_MB", "")
    assert settings.read("PORTKIT_POOL_MB") == 256
    monkeypatch.setenv("PORTKIT_POOL_MB", "3")
    assert settings.megabytes("PORTKIT_POOL_MB") == 3 << 20
    monkeypatch.setenv("PORTKIT_KERNEL_CACHE", "0")
    with pytest.raises(ValueError, match="positive"):
        settings.read("PORTKIT_KERNEL_CACHE")


def test_an_undeclared_setting_is_a_key_error():
    with pytest.raises(KeyError):
        settings.read("PORTKIT_NO_SUCH_SETTING")
