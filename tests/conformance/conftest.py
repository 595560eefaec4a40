"""Fixtures of the conformance tests."""
import importlib
from pathlib import Path

import pytest


@pytest.fixture
def broken(monkeypatch):
    """The broken_backends module, importable by name (so entry points can name it too)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return importlib.import_module("broken_backends")
