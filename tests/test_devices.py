"""Several devices per backend: names with an index, the count, loading each, listing them."""
import os
import subprocess
import sys

import pytest

from portkit import Tensor, backends, runtime
from portkit.cli import main

SEVERAL = """
from dataclasses import replace
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.interpreter import backend as interpreter

loaded = []

def _load(index=0):
    loaded.append(index)
    device = interpreter.load()
    return replace(device, capabilities=replace(device.capabilities,
                                                device_name=f"unit {index}"))

backend = Backend("multi", _load, abi_version=ABI_VERSION, devices=lambda: 3)
"""

ONE = """
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.interpreter import backend as interpreter

def _load():        # a backend written before devices had indices: no argument
    return interpreter.load()

backend = Backend("single", _load, abi_version=ABI_VERSION)
"""


def test_a_name_without_an_index_is_device_zero():
    assert backends.split("opencl:1") == ("opencl", 1) and backends.split("cpu") == ("cpu", 0)
    assert backends.canonical("cpu:0") == "cpu" and backends.canonical("cpu:1") == "cpu:1"
    assert runtime.get("cpu:0") is runtime.get("cpu")
    assert runtime.device_name("cpu:0") == "cpu"
    assert Tensor([1.0], device="cpu:0").device == "cpu"
    second = Tensor([1.0, 2.0], device="cpu:1")
    assert second.device == "cpu:1" and (second * 2).numpy().tolist() == [2.0, 4.0]
    assert runtime.get("cpu:1") is not runtime.get("cpu")


def test_the_cpu_backend_has_the_devices_its_setting_names(monkeypatch):
    assert backends.device_count("cpu") == 2     # PORTKIT_CPU_DEVICES' default
    assert "logical device 1" in runtime.get("cpu:1").capabilities.device_name
    monkeypatch.setattr(backends, "_loaded", {})
    monkeypatch.setattr(backends, "_counts", {})
    monkeypatch.setenv("PORTKIT_CPU_DEVICES", "3")
    assert backends.device_count("cpu") == 3 and backends.load("cpu:2").name == "cpu"


def test_an_index_past_the_count_names_the_count(fake_backends, fake_backend_module):
    fake_backends({"multi": fake_backend_module(SEVERAL)})
    with pytest.raises(backends.NoSuchDevice, match=r"backend 'multi' has 3 devices here "
                       r"\(multi:0 to multi:2\).*use an index below 3") as raised:
        backends.load("multi:3")
    assert isinstance(raised.value, RuntimeError)      # as torch's invalid device ordinal
    assert backends.load("multi:2").capabilities.device_name == "unit 2"
    assert backends.load("multi:0") is backends.load("multi")
    assert backends.device_count("multi") == 3


def test_a_backend_without_devices_keeps_its_load_without_an_index(fake_backends,
                                                                    fake_backend_module):
    fake_backends({"single": fake_backend_module(ONE)})
    assert backends.load("single:0") is backends.load("single")
    assert backends.device_count("single") == 1
    with pytest.raises(backends.NoSuchDevice, match="has 1 device here"):
        backends.load("single:1")


def test_portkit_backends_lists_each_device(fake_backends, fake_backend_module, monkeypatch,
                                            capsys):
    monkeypatch.setenv("COLUMNS", "250")
    fake_backends({"multi": fake_backend_module(SEVERAL)})
    assert main(["backends"]) == 0
    lines = [line.strip("│ ") for line in capsys.readouterr().out.splitlines()]
    found = {line.split("│")[0].strip(): line for line in lines if "│" in line}
    assert "unit 0" in found["multi"] and "unit 2" in found["multi:2"]
    assert "available" in found["multi:1"]


def test_opencl_numbers_pocl_devices():
    """POCL_DEVICES="pthread pthread" gives PoCL two devices: opencl and opencl:1 compute and
    copy to each other (through the host: each device has its own context)."""
    script = ("from portkit import Tensor, backends\n"
              "x = Tensor([1.0, 2.0], device='opencl:1')\n"
              "print(backends.device_count('opencl'), x.device, (x.to('opencl') * 3).tolist())\n")
    env = {**os.environ, "POCL_DEVICES": "pthread pthread"}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "opencl:1", "[3.0,", "6.0]"]
