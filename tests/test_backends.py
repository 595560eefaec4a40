"""Backend discovery: entry points, caching, and every way a backend can fail to load."""
import re
import sys
from pathlib import Path

import pytest

from portkit import Tensor, backends
from portkit.abi import BackendUnavailable, CapabilityError, Device

INTERPRETER = "portkit.reference_backends.interpreter:backend"

UNAVAILABLE = """
from portkit.abi import ABI_VERSION, Backend, BackendUnavailable

def _load():
    raise BackendUnavailable("no frobnicator driver", "apt-get install frobnicator")

backend = Backend("frob", _load, abi_version=ABI_VERSION)
"""

LOAD_RAISES = """
from portkit.abi import ABI_VERSION, Backend

def _load():
    raise RuntimeError("driver table corrupt")

backend = Backend("bad", _load, abi_version=ABI_VERSION)
"""

COUNTED = """
from portkit.abi import ABI_VERSION, Backend, BackendUnavailable

calls = 0

def _load():
    global calls
    calls += 1
    raise BackendUnavailable("no device")

backend = Backend("counted", _load, abi_version=ABI_VERSION)
"""

NO_REQUIRED_OPS = """
from dataclasses import replace
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.interpreter import backend as interpreter

def _load():
    device = interpreter.load()
    return replace(device, capabilities=replace(device.capabilities, ops=frozenset()))

backend = Backend("weak", _load, abi_version=ABI_VERSION)
"""


VERSIONED = """
from portkit.abi import Backend
from portkit.reference_backends.interpreter import backend as interpreter

backend = Backend({name!r}, interpreter.load{version})
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


def test_two_packages_registering_one_name_are_both_named_and_neither_loads(
        fake_backends, fake_backend_module):
    first = fake_backend_module(VERSIONED.format(name="twice",
                                                 version=", abi_version=interpreter.abi_version"))
    second = fake_backend_module(LOAD_RAISES)
    fake_backends([("twice", first), ("twice", second)])
    assert backends.names() == ["twice"]
    with pytest.raises(backends.BrokenBackend, match="registered by 2 packages") as error:
        backends.load("twice")
    assert first.split(":")[0] in str(error.value) and second.split(":")[0] in str(error.value)


def test_a_package_registering_a_reference_name_does_not_replace_the_reference(
        fake_backends, fake_backend_module):
    impostor = fake_backend_module("""
from dataclasses import replace
from portkit.abi import ABI_VERSION, Backend
from portkit.reference_backends.interpreter import backend as interpreter

def _load():
    device = interpreter.load()
    return replace(device, capabilities=replace(device.capabilities, device_name="impostor"))

backend = Backend("interpreter", _load, abi_version=ABI_VERSION)
""")
    fake_backends([("interpreter", impostor), ("interpreter", INTERPRETER)])
    with pytest.warns(backends.BackendConflict) as warned:
        device = backends.load("interpreter")
    message = str(warned[0].message)
    assert impostor.split(":")[0] in message and "portkit's is used" in message
    assert device.capabilities.device_name == "numpy"


@pytest.mark.parametrize("statement, raised", [
    ("import sys; sys.exit(3)", "SystemExit: 3 (it called sys.exit)"),
    ("raise SystemExit('no device')", "SystemExit: no device"),
    ("raise GeneratorExit('odd')", "GeneratorExit: odd"),
])
@pytest.mark.parametrize("where", ["import", "load"])
def test_a_backend_exiting_or_raising_base_exceptions_is_broken_not_fatal(
        fake_backends, fake_backend_module, statement, raised, where):
    body = (f"{statement}\n" if where == "import" else "") + f"""
from portkit.abi import ABI_VERSION, Backend

def _load():
    {statement if where == "load" else "pass"}

backend = Backend("quits", _load, abi_version=ABI_VERSION)
"""
    fake_backends({"quits": fake_backend_module(body)})
    with pytest.raises(backends.BrokenBackend, match=re.escape(raised)):
        backends.load("quits")
    assert backends.available()["quits"].startswith("broken backend package")


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
    (("from portkit.abi import ABI_VERSION, Backend\n"
     "backend = Backend('bad', lambda: 'nope', abi_version=ABI_VERSION)\n"),
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


@pytest.mark.parametrize("name, version, problem, fix", [
    ("acc", "", "backend 'acc' declares no ABI version", "pass abi_version="),
    ("acc", ", abi_version='0.1'", "backend 'acc' implements ABI 0.1; this portkit implements",
     "install a portkit whose ABI is 0.1, or port the backend"),
    ("brokenaccel", ", abi_version=interpreter.abi_version",
     "the entry point 'acc' serves a Backend named 'brokenaccel'", "the same name"),
])
def test_the_version_contract_refuses_with_both_sides_named(
        fake_backends, fake_backend_module, name, version, problem, fix):
    fake_backends({"acc": fake_backend_module(VERSIONED.format(name=name, version=version))})
    with pytest.raises(backends.BrokenBackend) as caught:
        backends.load("acc")
    assert problem in caught.value.reason and fix in caught.value.fix


def test_abi_versions_are_compatible_by_the_documented_rule():
    assert backends.compatible("0.3", "0.3") and not backends.compatible("0.2", "0.3")
    assert not backends.compatible("0.4", "0.3")          # before 1.0: exact major.minor
    assert backends.compatible("1.0", "1.2") and not backends.compatible("1.3", "1.2")
    assert not backends.compatible("2.0", "1.2") and not backends.compatible("one", "1.2")


def test_the_scaffold_declares_the_abi_it_was_written_for():
    import json

    from portkit.abi import ABI_VERSION

    template = json.loads((Path(__file__).parents[1] / "templates" / "backend" /
                           "cookiecutter.json").read_text())
    assert template["_abi_version"] == ABI_VERSION


@pytest.mark.parametrize("value", ["::::", "", "pkg.mod:", ":backend"])
def test_a_malformed_entry_point_value_is_a_broken_package_naming_it(fake_backends, value):
    fake_backends({"odd": value, "interpreter": INTERPRETER})
    with pytest.raises(backends.BrokenBackend) as caught:
        backends.load("odd")
    message = str(caught.value)
    assert "entry point 'odd'" in message and f"value {value!r}" in message
    assert 'odd = "package.module:backend"' in message
    assert backends.available()["interpreter"] is None


@pytest.mark.parametrize("typed, hint", [
    ("cdua", "did you mean 'cuda'?"),
    ("CPU", "did you mean 'cpu'?"),
    ("cdua:1", "did you mean 'cuda'?"),
    ("cpu:x", "what follows ':' is a device index"),
    ("cpu:99", "backend 'cpu' has"),
])
def test_a_mistyped_device_raises_where_it_is_typed(typed, hint):
    """Every way a tensor op names a device checks the name at once, as torch's RuntimeError
    for an unknown device string does, instead of failing at the first read-back."""
    ops = [lambda: Tensor([1.0]).to(typed), lambda: Tensor([1.0], device=typed),
           lambda: Tensor.arange(3, device=typed), lambda: Tensor.zeros(2, device=typed),
           lambda: Tensor.rand(2, device=typed)]
    for op in ops:
        with pytest.raises(backends.UnknownBackend, match=re.escape(hint)) as raised:
            op()
        assert isinstance(raised.value, RuntimeError)


def test_a_bad_default_device_names_its_source(monkeypatch):
    monkeypatch.setenv("PORTKIT_DEVICE", "gpu")
    with pytest.raises(BackendUnavailable, match="did you mean 'webgpu'.*PORTKIT_DEVICE"):
        Tensor([1.0])
