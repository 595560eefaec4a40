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


def _build(kind: str, tmp_path: Path, python: str = sys.executable) -> Path:
    """An sdist or a wheel built by setuptools (`python`'s) from a copy of the tree; its path."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)
    script = ("import sys; from setuptools import build_meta; "
              f"print(build_meta.build_{kind}(sys.argv[1]))")
    build = subprocess.run([python, "-c", script, str(tmp_path / "dist")],
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


def _venv(where: Path, *packages: str) -> Path:
    """A fresh virtualenv at `where` with `packages` installed from PyPI; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = where / "bin" / "python"
    if packages:
        pip = subprocess.run([python, "-m", "pip", "install", "-q", *packages],
                             capture_output=True, text=True, check=False)
        assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return python


@pytest.mark.slow
def test_a_wheel_from_the_oldest_setuptools_installs_and_runs_the_readme_example(tmp_path):
    """About 40 s, from PyPI: the wheel that the oldest setuptools series the metadata allows builds
    carries the docs and templates (`portkit docs` and `portkit new-backend` read them from
    the package), installs into a fresh virtualenv with its dependencies, and runs the README's
    first program outside the repository."""
    import zipfile

    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # ">=77" -> "==77.*": the oldest release series the metadata allows
    [oldest] = [r.replace(">=", "==") + ".*" for r in project["build-system"]["requires"]]
    wheel = _build("wheel", tmp_path, str(_venv(tmp_path / "build", oldest)))
    names = set(zipfile.ZipFile(wheel).namelist())
    docs = {f"portkit/_docs/{path.relative_to(ROOT / 'docs').as_posix()}"
            for path in (ROOT / "docs").rglob("*.md")}
    assert docs <= names, sorted(docs - names)
    assert "portkit/_templates/backend/cookiecutter.json" in names

    python = _venv(tmp_path / "fresh", str(wheel))
    readme = (ROOT / "README.md").read_text()
    example = readme.split("```python\n", 1)[1].split("```", 1)[0]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PORTKIT_DEVICE")}
    ran = subprocess.run([python, "-c", example], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.startswith("54.0 ["), ran.stdout      # (x @ x).relu().sum() of [[1,2],[3,4]]
    shown = subprocess.run([python, "-m", "portkit", "--version"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert shown.startswith("portkit ") and "backend ABI" in shown


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
