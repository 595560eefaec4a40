"""Packaging: the licence and metadata, py.typed, cookiecutter as an extra, and an sdist whose
own tests run (they need the conftest.py files and the docs they read)."""
import os
import shutil
import subprocess
import sys
import tarfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".ruff_cache", ".hypothesis", "reports",
                              "portkit-*")


def _build(kind: str, tmp_path: Path) -> Path:
    """An sdist or a wheel built by setuptools from a copy of the tree; its path."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)
    script = ("import sys; from setuptools import build_meta; "
              f"print(build_meta.build_{kind}(sys.argv[1]))")
    build = subprocess.run([sys.executable, "-c", script, str(tmp_path / "dist")],
        cwd=source, capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stdout + build.stderr
    return tmp_path / "dist" / build.stdout.strip().splitlines()[-1]


def test_licence_and_typed_marker_ship():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert (ROOT / "portkit" / "py.typed").is_file()
    project = (ROOT / "pyproject.toml").read_text()
    assert 'license = "MIT"' in project and '"portkit" = ["py.typed"]' in project


@pytest.mark.slow
def test_sdist_carries_its_tests_and_they_run(tmp_path):
    """About 15 s: builds an sdist from a copy of the tree, unpacks it, and runs a few of its
    test files from the unpacked folder alone."""
    archive = _build("sdist", tmp_path)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    [unpacked] = (tmp_path / "unpacked").iterdir()
    for needed in ("LICENSE", "tests/conftest.py", "tests/conformance/conftest.py",
                   "portkit/py.typed", "portkit/conformance/report.schema.json",
                   "docs/conformance.md", "templates/backend/cookiecutter.json"):
        assert (unpacked / needed).is_file(), f"the sdist lacks {needed}"
    metadata = Parser().parsestr((unpacked / "PKG-INFO").read_text())
    assert metadata["License-Expression"] == "MIT"
    requires = metadata.get_all("Requires-Dist")
    assert "cookiecutter; extra == \"scaffold\"" in requires
    assert not any(r.startswith("cookiecutter") and "extra" not in r for r in requires)
    env = {**os.environ, "PYTHONPATH": str(unpacked)}
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cli.py",
         "tests/conformance/test_docs.py"],
        cwd=unpacked, env=env, capture_output=True, text=True, check=False)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-3000:]
    assert " passed" in tests.stdout


@pytest.mark.slow
def test_wheel_ships_the_docs_and_the_templates(tmp_path):
    """About 15 s: `portkit docs` and `portkit new-backend` must work from an installed wheel,
    which has no docs/ or templates/ beside it."""
    import zipfile
    wheel = _build("wheel", tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    docs = {f"portkit/_docs/{path.relative_to(ROOT / 'docs').as_posix()}"
            for path in (ROOT / "docs").rglob("*.md")}
    assert docs <= names, sorted(docs - names)
    assert "portkit/_templates/backend/cookiecutter.json" in names


def test_the_build_requirement_reads_the_licence_field():
    """`license = "MIT"` (an SPDX expression) needs setuptools 77; an older build failed."""
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [setuptools] = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    assert isinstance(project["project"]["license"], str)
    assert tuple(int(p) for p in setuptools.split(">=")[1].split(".")) >= (77,)
    assert "onnxscript" in project["project"]["optional-dependencies"]["onnx"]


def test_python_dash_m_portkit_runs_the_command_line():
    shown = subprocess.run([sys.executable, "-m", "portkit", "--version"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
    assert shown.startswith("portkit ") and "backend ABI" in shown
