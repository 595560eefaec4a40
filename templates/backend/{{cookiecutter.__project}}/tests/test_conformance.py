"""{{ cookiecutter.name }}'s own tests: portkit finds the backend, and `portkit conform` passes."""
import subprocess
import sys

from portkit import backends

NAME = "{{ cookiecutter.name }}"


def test_registered_and_loads():
    assert NAME in backends.names(), "reinstall this package: pip install -e ."
    assert backends.load(NAME).name == NAME


def test_conform_quick(tmp_path):
    # The same command a person types; its table shows what failed and how to replay it.
    command = [sys.executable, "-m", "portkit.cli", "conform", "--backend", NAME, "--quick",
               "--junit", str(tmp_path / "conform.xml"), "--repro-dir", str(tmp_path / "repro")]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
