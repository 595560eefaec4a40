"""Fixtures of the conformance tests."""
import importlib
import json
from pathlib import Path

import pytest


@pytest.fixture
def broken(monkeypatch):
    """The broken_backends module, importable by name (so entry points can name it too)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    return importlib.import_module("broken_backends")


@pytest.fixture(autouse=True)
def every_json_report_is_valid(monkeypatch):
    """Every JSON report a conformance test writes (runs, shards, merges) is checked against
    the schema file shipped in the package, as it is written."""
    jsonschema = pytest.importorskip("jsonschema", reason="pip install 'portkit[test]'")
    from portkit.conformance import report

    validator = jsonschema.Draft202012Validator(report.schema())
    write = report.write_json

    def checked(run, path):
        write(run, path)
        validator.validate(json.loads(Path(path).read_text()))

    monkeypatch.setattr(report, "write_json", checked)
