"""Backend discovery: entry points, caching, and every way a backend can fail to load."""
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from portkit import backends
from portkit.abi import BackendUnavailable, CapabilityError, Device

INTERPRETER = "portkit.abi.interpreter:backend"

UNAVAILABLE = """
from portkit.abi import Backend, BackendUnavailable

def _load():
    raise BackendUnavailable("no frobnicator driver", "apt-get install frobnicator")

backend = Backend("frob", _load)
"""

LOAD_RAISES = """
from portkit.abi import Backend

def _load():
    raise RuntimeError("driver table corrupt")

backend = Backend("bad", _load)
"""

COUNTED = """
from portkit.abi import Backend, BackendUnavailable

calls = 0

def _load():
    global calls
    calls += 1
    raise BackendUnavailable("no device")

backend = Backend("counted", _load)
"""

NO_REQUIRED_OPS = """
from dataclasses import replace
from portkit.abi import Backend
from portkit.abi.interpreter import backend as interpreter

def _load():
    device = interpreter.load()
    return replace(device, capabilities=replace(device.capabilities, ops=frozenset()))

backend = Backend("weak", _load)
"""


def test_portkit_registers_every_reference_backend_as_in_pyproject():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"][backends.GROUP]
    assert backends._REFERENCE == declared
    found = {point.name: point.value for point in backends.entry_points()}
    assert {name: found.get(name) for name in declared} == declared


def test_interpreter_loads_through_real_discovery_and_is_cached():
    device = backends.load("interpreter")
    assert isinstance(device, Device) and device.capabilities.device_name == "numpy"
    assert backends.load("interpreter") is device
    assert backends.available()["interpreter"] is None


def test_names_are_sorted(fake_backends):
    fake_backends({"zeta": INTERPRETER, "alpha": INTERPRETER})
    assert backends.names() == ["alpha", "zeta"]


def test_first_registration_of_a_name_wins(monkeypatch, fake_backends, fake_backend_module):
    fake_backends({})
    points = [EntryPoint("twice", INTERPRETER, backends.GROUP),
              EntryPoint("twice", fake_backend_module(LOAD_RAISES), backends.GROUP)]
    monkeypatch.setattr(backends, "entry_points", lambda: points)
    assert backends.names() == ["twice"]
    assert isinstance(backends.load("twice"), Device)


def test_unknown_name_lists_the_known_ones(fake_backends):
    fake_backends({"interpreter": INTERPRETER, "other": INTERPRETER})
    with pytest.raises(BackendUnavailable, match=r"no backend named 'nope'.*interpreter, other"):
        backends.load("nope")


def test_unavailable_backend_passes_its_reason_and_fix_through(fake_backends, fake_backend_module):
    fake_backends({"frob": fake_backend_module(UNAVAILABLE)})
    with pytest.raises(BackendUnavailable) as caught:
        backends.load("frob")
    assert not isinstance(caught.value, backends.BrokenBackend)
    assert (caught.value.reason, caught.value.fix) == ("no frobnicator driver",
                                                       "apt-get install frobnicator")
    assert backends.available() == {"frob": "no frobnicator driver; "
                                             "fix: apt-get install frobnicator"}


@pytest.mark.parametrize("source, error", [
    ("import no_such_driver_module\n", "ModuleNotFoundError: No module named 'no_such_driver"),
    ("raise ImportError('libfoo.so: cannot open shared object file')\n", "libfoo.so"),
    ("backend = 42\n", "is a int, not a portkit.abi.Backend"),
    (LOAD_RAISES, "RuntimeError: driver table corrupt"),
    ("from portkit.abi import Backend\nbackend = Backend('x', lambda: 'nope')\n",
     "load() returned a str, not a portkit.abi.Device"),
])
def test_broken_package_is_reported_with_the_fix_never_raised_raw(
        fake_backends, fake_backend_module, source, error):
    point = fake_backend_module(source)
    fake_backends({"bad": point})
    package = point.split(":")[0]
    with pytest.raises(backends.BrokenBackend) as caught:
        backends.load("bad")
    message = str(caught.value)
    assert message.startswith(f"broken backend package {package}: ")
    assert error in message
    assert message.endswith(f"fix: reinstall {package}, or report this error to its author")


def test_missing_module_of_a_registered_backend_is_broken(fake_backends):
    fake_backends({"ghost": "portkit.reference_backends.ghost:backend"})
    reason = backends.available()["ghost"]
    assert reason.startswith("broken backend package portkit: ModuleNotFoundError")


def test_invalid_capabilities_raise_capability_error_naming_backend_and_ops(
        fake_backends, fake_backend_module):
    fake_backends({"weak": fake_backend_module(NO_REQUIRED_OPS)})
    with pytest.raises(CapabilityError, match=r"backend 'weak': declares no support for "
                                              r"required ops \[.*'ADD'"):
        backends.load("weak")


def test_available_reports_every_backend_without_raising(fake_backends, fake_backend_module):
    fake_backends({"interpreter": INTERPRETER, "frob": fake_backend_module(UNAVAILABLE),
                   "bad": fake_backend_module(LOAD_RAISES),
                   "weak": fake_backend_module(NO_REQUIRED_OPS)})
    reasons = backends.available()
    assert list(reasons) == ["bad", "frob", "interpreter", "weak"]
    assert reasons["interpreter"] is None
    assert "no frobnicator driver" in reasons["frob"]
    assert "broken backend package" in reasons["bad"]
    assert "required ops" in reasons["weak"]


def test_failures_are_cached_so_a_missing_driver_is_probed_once(fake_backends, fake_backend_module):
    point = fake_backend_module(COUNTED)
    fake_backends({"counted": point})
    for _ in range(2):
        with pytest.raises(BackendUnavailable, match="no device"):
            backends.load("counted")
    assert backends.available() == {"counted": "no device"}
    assert sys.modules[point.split(":")[0]].calls == 1
