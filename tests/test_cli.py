"""The `portkit` command line: `portkit backends` and the parser around it."""
import pytest

from portkit import __version__
from portkit.cli import main

UNAVAILABLE = """
from portkit.abi import ABI_VERSION, Backend, BackendUnavailable

def _load():
    raise BackendUnavailable("no frobnicator driver [v2]", "apt-get install frobnicator")

backend = Backend("frob", _load, abi_version=ABI_VERSION)
"""


@pytest.fixture
def wide(monkeypatch):
    """A terminal wide enough that rich does not wrap the reasons."""
    monkeypatch.setenv("COLUMNS", "250")


def rows(output: str) -> dict[str, str]:
    """The table's rows by backend name, each row's cells joined by '|'."""
    cells = {}
    for line in output.splitlines():
        parts = [part.strip() for part in line.strip("│ ").split("│")]
        if len(parts) == 3 and parts[0]:
            cells[parts[0]] = "|".join(parts)
    return cells


def test_backends_lists_available_unavailable_and_broken(fake_backends, fake_backend_module,
                                                         wide, capsys):
    fake_backends({"interpreter": "portkit.abi.interpreter:backend",
                   "frob": fake_backend_module(UNAVAILABLE),
                   "ghost": "portkit.reference_backends.ghost:backend"})
    assert main(["backends"]) == 0
    output = capsys.readouterr().out
    table = rows(output)
    assert table["interpreter"] == "interpreter|available|numpy"
    assert table["frob"] == "frob|unavailable|no frobnicator driver [v2]"
    assert "fix: apt-get install frobnicator" in output
    assert table["ghost"].startswith("ghost|broken|broken backend package portkit: "
                                     "ModuleNotFoundError")
    assert "fix: reinstall portkit, or report this error to its author" in output
    assert "Traceback" not in output


def test_backends_shows_invalid_capabilities(fake_backends, fake_backend_module, wide, capsys):
    weak = fake_backend_module("""
from dataclasses import replace
from portkit.abi import ABI_VERSION, Backend
from portkit.abi.interpreter import backend as interpreter

backend = Backend("weak", lambda: replace(interpreter.load(), capabilities=replace(
    interpreter.load().capabilities, ops=frozenset())), abi_version=ABI_VERSION)
""")
    fake_backends({"weak": weak})
    assert main(["backends"]) == 0
    assert rows(capsys.readouterr().out)["weak"].startswith(
        "weak|invalid|backend 'weak': declares no support for required ops")


def test_version_and_missing_command(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"portkit {__version__}"
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2 and "required: command" in capsys.readouterr().err
