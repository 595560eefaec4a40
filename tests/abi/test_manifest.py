"""The ABI in code must equal the checked-in manifest.json, and a released version never changes."""
import json

import pytest

from portkit.abi import ABI_VERSION, manifest

HOW_TO_BUMP = ("the ABI in code differs from portkit/abi/manifest.json. If the change is meant: "
               "bump ABI_VERSION in portkit/abi/version.py, then run "
               "`python -m portkit.abi.manifest --write` and commit manifest.json")


def test_code_matches_the_checked_in_manifest():
    recorded = manifest.checked_in()["abi"]
    now = json.loads(json.dumps(manifest.current()))
    changed = sorted(key for key in now.keys() | recorded.keys()
                     if now.get(key) != recorded.get(key))
    assert not changed, f"{HOW_TO_BUMP} (sections that differ: {changed})"


def test_checked_in_manifest_is_recorded_under_the_current_version():
    recorded = manifest.checked_in()
    assert recorded["abi_version"] == ABI_VERSION, (
        f"manifest.json records ABI {recorded['abi_version']} but the code says {ABI_VERSION}: "
        "run `python -m portkit.abi.manifest --write`")
    assert recorded["history"].get(ABI_VERSION) == manifest.digest(recorded["abi"]), (
        f"manifest.json's history has no matching digest for {ABI_VERSION}: {HOW_TO_BUMP}")


@pytest.fixture
def manifest_file(monkeypatch, tmp_path):
    """A scratch manifest.json in place of the real one."""
    path = tmp_path / "manifest.json"
    monkeypatch.setattr(manifest, "PATH", path)
    return path


def test_write_refuses_a_changed_abi_under_a_released_version(manifest_file):
    released = {"abi_version": ABI_VERSION, "history": {ABI_VERSION: "0" * 64}, "abi": {}}
    manifest_file.write_text(json.dumps(released))
    with pytest.raises(SystemExit, match=f"ABI_VERSION is still {ABI_VERSION}: bump it"):
        manifest.write()
    assert json.loads(manifest_file.read_text()) == released


def test_write_records_a_new_version_and_keeps_the_history(manifest_file, monkeypatch):
    manifest_file.write_text(json.dumps({"abi_version": "0.0", "history": {"0.0": "0" * 64},
                                         "abi": {}}))
    monkeypatch.setattr(manifest, "ABI_VERSION", "9.9")
    manifest.write()
    written = json.loads(manifest_file.read_text())
    assert written["abi_version"] == "9.9"
    assert written["history"] == {"0.0": "0" * 64, "9.9": manifest.digest(manifest.current())}
    assert written["abi"] == json.loads(json.dumps(manifest.current()))


def test_write_is_idempotent_for_an_unchanged_abi(manifest_file):
    manifest.write()
    first = manifest_file.read_text()
    manifest.write()
    assert manifest_file.read_text() == first
