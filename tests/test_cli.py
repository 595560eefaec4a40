"""The `portkit` command line: `portkit backends` and the parser around it."""
import pytest

from portkit import __version__
from portkit.abi import ABI_VERSION
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
    fake_backends({"interpreter": "portkit.reference_backends.interpreter:backend",
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
from portkit.reference_backends.interpreter import backend as interpreter

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
    shown = capsys.readouterr().out.strip()
    assert exited.value.code == 0 and shown == f"portkit {__version__} (backend ABI {ABI_VERSION})"
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2 and "required: command" in capsys.readouterr().err


def test_a_fix_with_an_extra_keeps_its_brackets(fake_backends, fake_backend_module, wide,
                                                capsys):
    # rich read `[cuda]` as a markup tag and printed `pip install 'portkit'`.
    fake_backends({"cudaish": fake_backend_module(UNAVAILABLE.replace(
        "apt-get install frobnicator", "pip install 'portkit[cuda]'").replace(
        'Backend("frob"', 'Backend("cudaish"'))})
    assert main(["conform", "--backend", "cudaish"]) == 2
    assert "pip install 'portkit[cuda]'" in capsys.readouterr().out
    assert main(["backends"]) == 0
    assert "pip install 'portkit[cuda]'" in capsys.readouterr().out


def test_no_case_selected_is_a_usage_error_naming_the_pattern(capsys):
    assert main(["conform", "--backend", "interpreter", "--quick", "--tier", "1",
                 "-k", "no-such-case"]) == 2
    output = " ".join(capsys.readouterr().out.split())
    assert "no case selected by -k 'no-such-case' --tier 1" in output
    assert "pytest --portkit-backend interpreter --portkit-quick --collect-only -q" in output
    assert "OK" not in output


def test_report_folders_are_made_before_the_run(tmp_path):
    out = tmp_path / "nightly" / "2026-11-23"
    args = ["conform", "--backend", "interpreter", "--quick", "--tier", "1",
            "--json", str(out / "r.json"), "--junit", str(out / "xml" / "r.xml"),
            "--html", str(out / "r.html")]
    assert main(args) == 0
    assert {p.name for p in out.rglob("r.*")} == {"r.json", "r.xml", "r.html"}


def test_an_unwritable_report_path_is_refused_before_any_case_runs(tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    assert main(["conform", "--backend", "interpreter", "--quick", "--tier", "1",
                 "--html", str(tmp_path / "file" / "r.html")]) == 2
    output = capsys.readouterr().out
    assert "cannot write a report to" in output and "choose another path" in output
    assert "passed" not in output and "Traceback" not in output


@pytest.mark.parametrize("shard", ["0/2", "3/2", "x", "1/0"])
def test_a_bad_shard_is_a_usage_error(shard, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["conform", "--backend", "interpreter", "--shard", shard])
    assert exited.value.code == 2 and "write I/N" in capsys.readouterr().err


@pytest.mark.parametrize("value, level", [("yes", 1), ("TRUE", 1), ("off", 0), ("3", 3),
                                          ("", 0)])
def test_portkit_debug_reads_levels_and_words(monkeypatch, value, level):
    from portkit import settings

    monkeypatch.setenv("PORTKIT_DEBUG", value)
    assert settings.read("PORTKIT_DEBUG") == level


def test_a_bad_portkit_debug_is_a_usage_error_naming_the_values(monkeypatch, capsys):
    monkeypatch.setenv("PORTKIT_DEBUG", "verbose")
    assert main(["backends"]) == 2
    assert "PORTKIT_DEBUG='verbose' is not a level: use 0-4, or yes/no" in capsys.readouterr().err


EXITS = """
import os
from portkit.abi import ABI_VERSION, Backend

def _load():
    os._exit(7)

backend = Backend("exits", _load, abi_version=ABI_VERSION)
"""

SEGFAULTS_ON_IMPORT = """
import ctypes
ctypes.string_at(0)
"""

HANGS = """
import time
from portkit.abi import ABI_VERSION, Backend

def _load():
    time.sleep(600)

backend = Backend("hangs", _load, abi_version=ABI_VERSION)
"""


def test_backends_survives_a_package_that_ends_the_process(fake_backends, fake_backend_module,
                                                           wide, capsys):
    fake_backends({"exits": fake_backend_module(EXITS),
                   "crashes": fake_backend_module(SEGFAULTS_ON_IMPORT),
                   "interpreter": "portkit.reference_backends.interpreter:backend",
                   "frob": fake_backend_module(UNAVAILABLE)})
    assert main(["backends"]) == 0
    table = rows(capsys.readouterr().out)
    assert table["exits"].startswith("exits|broken|broken backend package: loading it ended "
                                     "the process: exit code 7")
    assert table["crashes"].startswith("crashes|broken|broken backend package: loading it "
                                       "ended the process: killed by SIGSEGV")
    assert table["interpreter"] == "interpreter|available|numpy"
    assert table["frob"] == "frob|unavailable|no frobnicator driver [v2]"


def test_a_backend_that_hangs_while_loading_is_broken_after_the_probe_timeout(
        fake_backends, fake_backend_module):
    from portkit import backends

    fake_backends({"hangs": fake_backend_module(HANGS),
                   "interpreter": "portkit.reference_backends.interpreter:backend"})
    found = {p.name: p for p in backends.probe(timeout=3)}
    assert found["hangs"].status == "broken" and "took over 3 s" in found["hangs"].detail
    assert found["interpreter"].status == "available"


def test_docs_lists_pages_shows_one_and_names_a_close_match(capsys):
    assert main(["docs"]) == 0
    listing = capsys.readouterr().out
    assert "porting" in listing and "backends/cpu" in listing
    assert "The portkit backend ABI" in listing
    assert main(["docs", "backends/reliability"]) == 0
    assert "PORTKIT_CHECK" in capsys.readouterr().out
    assert main(["docs", "abi.md", "--path"]) == 0
    assert capsys.readouterr().out.strip().endswith("abi.md")
    assert main(["docs", "portin"]) == 2
    assert "did you mean porting" in capsys.readouterr().err


def test_backends_reports_a_malformed_entry_point_without_a_traceback(fake_backends, wide,
                                                                      capsys):
    fake_backends({"odd": "::::", "interpreter": "portkit.reference_backends.interpreter:backend"})
    assert main(["backends"]) == 0
    captured = capsys.readouterr()
    table = rows(captured.out)
    assert table["odd"].startswith("odd|broken|broken backend package: entry point 'odd' in "
                                   "the 'portkit.backends' group has the value '::::'")
    assert "SIGKILL" not in captured.out and "Traceback" not in captured.out + captured.err
    assert table["interpreter"] == "interpreter|available|numpy"
