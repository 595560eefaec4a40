"""Fixtures shared across the test suite."""
import importlib
import itertools
import re
from importlib.metadata import EntryPoint

import pytest

from portkit import backends


@pytest.fixture
def fake_backends(monkeypatch):
    """Call with {name: "module:attribute"} (or a list of such pairs, to register one name
    twice): those become the only registered backends."""
    def install(points: dict[str, str] | list[tuple[str, str]]) -> None:
        pairs = points.items() if isinstance(points, dict) else points
        registered = [EntryPoint(name, value, backends.GROUP) for name, value in pairs]
        monkeypatch.setattr(backends, "entry_points", lambda: registered)
        # A private cache, so that devices loaded by other tests stay the same objects.
        monkeypatch.setattr(backends, "_loaded", {})
        monkeypatch.setattr(backends, "_counts", {})

    return install


@pytest.fixture
def fake_backend_module(monkeypatch, tmp_path):
    """Call with a module's source (defining `backend`); returns its entry point value."""
    monkeypatch.syspath_prepend(str(tmp_path))
    counter = itertools.count()
    prefix = "fake_backend_" + re.sub(r"\W", "_", tmp_path.name)   # unique per test

    def write(source: str) -> str:
        name = f"{prefix}_{next(counter)}"
        (tmp_path / f"{name}.py").write_text(source)
        importlib.invalidate_caches()
        return f"{name}:backend"

    return write
