"""Finds backends through the `portkit.backends` entry point group and loads them.

Any installed package adds a backend by naming a `portkit.abi.Backend` in that group; portkit's
reference backends register the same way, in its own pyproject.toml. Loading never crashes the
caller: a backend that cannot run here, or a package that is broken, becomes a typed error whose
message names the fix.
"""
from __future__ import annotations

from importlib import metadata

from portkit.abi import ABI_VERSION, Backend, BackendUnavailable, CapabilityError, Device

GROUP = "portkit.backends"

# portkit's own registrations, as in pyproject.toml, for a checkout that pip has not installed
# (tests/test_backends.py keeps the two equal).
_REFERENCE = {name: f"portkit.reference_backends.{name}:backend"
              for name in ("cpu", "opencl", "cuda", "metal", "webgpu")}
_REFERENCE["interpreter"] = "portkit.abi.interpreter:backend"


class BrokenBackend(BackendUnavailable):
    """A backend package that failed to import or load: a bug in it, not a missing driver."""


def compatible(declared: str, implemented: str = ABI_VERSION) -> bool:
    """Whether a backend written for ABI `declared` runs on portkit's ABI `implemented`: before
    1.0 each minor version may break backends, so the major.minor must match; from 1.0 on,
    the same major and a minor no newer than portkit's (minor versions only add)."""
    try:
        want = tuple(int(p) for p in declared.split(".")[:2])
        have = tuple(int(p) for p in implemented.split(".")[:2])
    except ValueError:
        return False
    if len(want) != 2 or have[0] == 0:
        return want == have
    return want[0] == have[0] and want[1] <= have[1]


def contract_problem(name: str, backend: Backend) -> tuple[str, str] | None:
    """(what is wrong, the fix) when the Backend an entry point serves breaks the contract:
    a different name than the entry point's, or an ABI version portkit does not implement."""
    if backend.name != name:
        return (f"the entry point {name!r} serves a Backend named {backend.name!r}",
                "give the entry point and Backend(...) the same name")
    if not backend.abi_version:
        what = f"backend {name!r} declares no ABI version"
        fix = (f'pass abi_version="{ABI_VERSION}" to Backend(...) once it passes '
               f"`portkit conform` on portkit's ABI {ABI_VERSION}")
        return what, fix
    if not compatible(backend.abi_version):
        what = (f"backend {name!r} implements ABI {backend.abi_version}; this portkit "
                f"implements ABI {ABI_VERSION}")
        fix = (f"install a portkit whose ABI is {backend.abi_version}, or port the backend "
               f"to ABI {ABI_VERSION} (docs/abi.md lists the changes) and declare it")
        return what, fix
    return None


def entry_points() -> list[metadata.EntryPoint]:
    """Every registration in the group, installed packages first. Tests replace this function."""
    found = list(metadata.entry_points(group=GROUP))
    try:
        metadata.distribution("portkit")
    except metadata.PackageNotFoundError:
        found += [metadata.EntryPoint(name, value, GROUP) for name, value in _REFERENCE.items()]
    return found


def names() -> list[str]:
    """The names of all registered backends, sorted."""
    return sorted({point.name for point in entry_points()})


def load(name: str) -> Device:
    """The device of backend `name`, loaded once. Raises BackendUnavailable or CapabilityError."""
    result = _load(name)
    if isinstance(result, Exception):
        raise result
    return result


def available() -> dict[str, str | None]:
    """Each backend's name -> None if it loads here, else the reason it does not and the fix."""
    reasons = {}
    for name in names():
        result = _load(name)
        reasons[name] = None if isinstance(result, Device) else str(result)
    return reasons


# name -> its device or why it does not load. Failures are kept as well: probing a missing
# driver again only costs time.
_loaded: dict[str, Device | BackendUnavailable | CapabilityError] = {}


def _load(name: str) -> Device | BackendUnavailable | CapabilityError:
    if name not in _loaded:
        _loaded[name] = _attempt(name)
    return _loaded[name]


def _attempt(name: str) -> Device | BackendUnavailable | CapabilityError:
    points = {}
    for point in entry_points():
        points.setdefault(point.name, point)
    if name not in points:
        return BackendUnavailable(f"no backend named {name!r}",
                                  f"use one of {', '.join(sorted(points)) or '(none)'}, "
                                  "or install the package that provides it")
    point = points[name]
    try:
        backend = point.load()
        if not isinstance(backend, Backend):
            raise TypeError(f"entry point {point.value} is a {type(backend).__name__}, "
                            "not a portkit.abi.Backend")
        problem = contract_problem(name, backend)
        if problem:
            package = point.dist.name if point.dist else point.module.split(".")[0]
            return BrokenBackend(f"broken backend package {package}: {problem[0]}", problem[1])
        device = backend.load()
        if not isinstance(device, Device):
            raise TypeError(f"load() returned a {type(device).__name__}, "
                            "not a portkit.abi.Device")
        device.capabilities.validate(name)
        return device
    except (BackendUnavailable, CapabilityError) as error:
        return error
    except Exception as error:  # noqa: BLE001 - a third-party bug must not crash the caller
        package = point.dist.name if point.dist else point.module.split(".")[0]
        return BrokenBackend(f"broken backend package {package}: "
                             f"{type(error).__name__}: {error}",
                             f"reinstall {package}, or report this error to its author")
