"""Finds backends through the `portkit.backends` entry point group and loads them.

Any installed package adds a backend by naming a `portkit.abi.Backend` in that group; portkit's
reference backends register the same way, in its own pyproject.toml. Loading never crashes the
caller: a backend that cannot run here, or a package that is broken, becomes a typed error whose
message names the fix.

A device is named by its backend and an index, as torch names them: "opencl:1" is the second
device of the opencl backend; a backend's name alone ("opencl", or "opencl:0") is its first.
"""
from __future__ import annotations

import difflib
import multiprocessing
import signal
import warnings
from dataclasses import dataclass
from importlib import metadata
from multiprocessing import connection

from portkit.abi import ABI_VERSION, Backend, BackendUnavailable, CapabilityError, Device

GROUP = "portkit.backends"

# portkit's own registrations, as in pyproject.toml, for a checkout that pip has not installed
# (tests/test_backends.py keeps the two equal).
_REFERENCE = {name: f"portkit.reference_backends.{name}:backend"
              for name in ("cpu", "opencl", "cuda", "metal", "webgpu")}
_REFERENCE["interpreter"] = "portkit.reference_backends.interpreter:backend"


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


def split(name: str) -> tuple[str, int]:
    """A device name's backend and device index: "opencl:1" -> ("opencl", 1), "cpu" ->
    ("cpu", 0). Raises UnknownBackend when what follows the ':' is not an index."""
    base, colon, index = name.partition(":")
    if not colon:
        return name, 0
    if not index.isdigit():
        raise UnknownBackend(f"no device named {name!r}: what follows ':' is a device index",
                             f"write {base!r} or {base + ':0'!r}, {base + ':1'!r}, ...")
    return base, int(index)


def canonical(name: str) -> str:
    """The one spelling of a device name: "cpu:0" and "cpu" are both "cpu"; "cpu:1" stays."""
    base, index = split(name)
    return f"{base}:{index}" if index else base


def load(name: str) -> Device:
    """The device `name` ("opencl", "opencl:1"), loaded once. Raises BackendUnavailable (its
    subclass NoSuchDevice for an index past the backend's device count) or CapabilityError."""
    result = _load(canonical(name))
    if isinstance(result, Exception):
        raise result
    return result


def device_count(name: str) -> int:
    """How many devices backend `name` has here (1 for a backend that does not say); loads
    its first device, so raises as `load(name)` does when the backend cannot run here."""
    base = split(name)[0]
    load(base)
    return _counts.get(base, 1)


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
_counts: dict[str, int] = {}    # backend name -> its device count, found when it loads


def _load(name: str) -> Device | BackendUnavailable | CapabilityError:
    if name not in _loaded:
        _loaded[name] = _attempt(name)
    return _loaded[name]


def entry_point(name: str) -> metadata.EntryPoint | None:
    """The registration that backend `name` loads from (see `choose`), or None if there is
    none or two packages claim the name."""
    found = [point for point in entry_points() if point.name == name]
    if not found:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendConflict)    # `load` has warned already
        point, conflict = choose(found)
    return None if conflict else point


def _attempt(name: str) -> Device | BackendUnavailable | CapabilityError:
    base, index = split(name)
    found = [point for point in entry_points() if point.name == base]
    if not found:
        known = names()
        close = difflib.get_close_matches(base.lower(), known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return UnknownBackend(f"no backend named {base!r}", f"{hint}use one of "
                              f"{', '.join(known) or '(none)'}, or install the package that "
                              "provides it")
    point, conflict = choose(found)
    if conflict:
        return conflict
    return load_point(point, index)


class UnknownBackend(BackendUnavailable, RuntimeError):
    """A device name that no installed backend registers; a RuntimeError too, as torch's error
    for an unknown device string."""


class NoSuchDevice(UnknownBackend):
    """A device index at or past its backend's device count ("cpu:5" where the cpu backend has
    2): a RuntimeError, as torch's invalid device ordinal."""


class BackendConflict(UserWarning):
    """Another package registers the name of one of portkit's reference backends; the
    reference is kept."""


def distribution(point: metadata.EntryPoint) -> str:
    """The name of the package that registered `point` (its module's top level if unknown, its
    value if that is not `module:attribute`)."""
    if point.dist:
        return point.dist.name
    found = point.pattern.match(point.value)
    return found.group("module").split(".")[0] if found else repr(point.value)


def malformed(point: metadata.EntryPoint) -> BrokenBackend | None:
    """The error for an entry point whose value is not `module:attribute` (such as `::::`),
    else None."""
    if point.pattern.match(point.value):
        return None
    return BrokenBackend(f"broken backend package: entry point {point.name!r} in the {GROUP!r} "
                         f"group has the value {point.value!r}, not 'module:attribute'",
                         f"write it as {point.name} = \"package.module:backend\" under "
                         f'[project.entry-points."{GROUP}"] in the package\'s pyproject.toml '
                         "and reinstall it")


def choose(points: list[metadata.EntryPoint]) -> tuple[metadata.EntryPoint, BrokenBackend | None]:
    """The registration to load among `points` (all of one name), and the error to report
    instead when two packages claim it. A reference backend's name always means portkit's own
    (the other package is named in a BackendConflict warning), so no package can replace the
    reference silently; two other packages with one name are both named, and neither loads."""
    unique = list({(p.value, distribution(p)): p for p in points}.values())
    if len(unique) == 1:
        return unique[0], None
    name = unique[0].name
    ours = [p for p in unique if p.value == _REFERENCE.get(name)]
    others = ", ".join(sorted({distribution(p) for p in unique if p not in ours}))
    if ours:
        warnings.warn(f"{others} registers backend {name!r}, the name of portkit's reference "
                      f"backend; portkit's is used. Rename {others}'s entry point in the "
                      f"{GROUP!r} group", BackendConflict, stacklevel=3)
        return ours[0], None
    return unique[0], BrokenBackend(
        f"backend {name!r} is registered by {len(unique)} packages: "
        + ", ".join(f"{distribution(p)} ({p.value})" for p in unique),
        "uninstall all but one of them, or rename the others' entry points")


def load_point(point: metadata.EntryPoint, index: int = 0
               ) -> Device | BackendUnavailable | CapabilityError:
    """Imports the backend that `point` names and loads its device `index` (`load()` for 0, so
    a backend with one device needs no index); every failure, even a SystemExit or
    another BaseException raised while importing or loading, comes back as a typed error.
    (KeyboardInterrupt still stops the caller; os._exit cannot be caught: `portkit backends`
    probes in a subprocess for that, portkit.conformance in its worker.)"""
    name = point.name
    broken = malformed(point)
    if broken:
        return broken
    try:
        backend = point.load()
        if not isinstance(backend, Backend):
            raise TypeError(f"entry point {point.value} is a {type(backend).__name__}, "
                            "not a portkit.abi.Backend")
        problem = contract_problem(name, backend)
        if problem:
            return BrokenBackend(f"broken backend package {distribution(point)}: {problem[0]}",
                                 problem[1])
        count = backend.devices() if backend.devices is not None else 1
        _counts[name] = count
        if index and index >= count:
            return NoSuchDevice(
                f"no device {name}:{index}: backend {name!r} has {count} device"
                f"{'s' if count != 1 else ''} here ({name}:0 to {name}:{count - 1})",
                f"use an index below {count}, or make more of the backend's devices visible "
                "(its docs say how)")
        device = backend.load(index) if index else backend.load()
        if not isinstance(device, Device):
            raise TypeError(f"load() returned a {type(device).__name__}, "
                            "not a portkit.abi.Device")
        device.capabilities.validate(name)
        return device
    except (BackendUnavailable, CapabilityError) as error:
        return error
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - a third-party bug must not end the caller
        package = distribution(point)
        how = " (it called sys.exit)" if isinstance(error, SystemExit) else ""
        return BrokenBackend(f"broken backend package {package}: "
                             f"{type(error).__name__}: {error}{how}",
                             f"reinstall {package}, or report this error to its author")


@dataclass
class Probe:
    """How one backend fared when loaded in a probe process: its status ("available",
    "unavailable", "broken" or "invalid"), the device name or the reason, and the fix."""

    name: str
    status: str
    detail: str
    fix: str = ""
    devices: tuple[str, ...] = ()     # each device's name, where the backend has several


def probe(only: list[str] | None = None, timeout: float = 120.0) -> list[Probe]:
    """Every registered backend (or those in `only`), each loaded in a child process, so that a
    package that calls
    os._exit, crashes or hangs (past `timeout` seconds) while importing or loading is reported
    as broken instead of ending the caller. One child loads them all; it is replaced when it
    dies. Spawned, not forked, so no driver state of this process is shared."""
    results: dict[str, Probe] = {}
    todo: list[tuple[str, str]] = []
    for name in only or names():
        if name not in names():
            results[name] = Probe(name, "unavailable", f"no backend named {name!r}",
                                  f"use one of {', '.join(names()) or '(none)'}, or install "
                                  "the package that provides it")
            continue
        point, conflict = choose([p for p in entry_points() if p.name == name])
        if conflict:
            results[name] = Probe(name, "broken", conflict.reason, conflict.fix or "")
        else:
            todo.append((name, point.value))
    context = multiprocessing.get_context("spawn")
    while todo:
        ours, theirs = context.Pipe()
        child = context.Process(target=_probe_child, args=(theirs, todo), daemon=True)
        child.start()
        theirs.close()
        while todo:
            hung = not connection.wait([ours, child.sentinel], timeout)
            found = None
            if not hung and ours.poll():    # a message, or the end of a dead child's pipe
                try:
                    found = ours.recv()
                except (EOFError, OSError):
                    found = None
            if found is None:
                child.kill()
                child.join()
                name = todo.pop(0)[0]
                why = (f"loading it took over {timeout:g} s" if hung
                       else f"loading it ended the process: {describe_exit(child.exitcode)}")
                results[name] = Probe(name, "broken", f"broken backend package: {why}",
                                      "report this to the package's author, with the output "
                                      "of `portkit backends`")
                break
            results[found.name] = found
            todo = [t for t in todo if t[0] != found.name]
        ours.close()
        child.join()
    return [results[name] for name in sorted(results)]


def _probe_child(pipe: connection.Connection, todo: list[tuple[str, str]]) -> None:
    for name, value in todo:
        point = metadata.EntryPoint(name, value, GROUP)
        found = load_point(point)
        if isinstance(found, Device):
            report = Probe(name, "available", found.capabilities.device_name or "-",
                           devices=_device_names(point, found))
        elif isinstance(found, BackendUnavailable):
            status = "broken" if isinstance(found, BrokenBackend) else "unavailable"
            report = Probe(name, status, found.reason, found.fix or "")
        else:
            report = Probe(name, "invalid", str(found))
        pipe.send(report)


def _device_names(point: metadata.EntryPoint, first: Device) -> tuple[str, ...]:
    """The name of each device of a backend with several (its first is `first`); () for one."""
    count = _counts.get(point.name, 1)
    if count < 2:
        return ()
    named = [first.capabilities.device_name or "-"]
    for index in range(1, count):
        found = load_point(point, index)
        named.append(found.capabilities.device_name or "-" if isinstance(found, Device)
                     else f"does not load: {found}")
    return tuple(named)


def describe_exit(code: int | None) -> str:
    """How a child process ended, from its exit code: the signal by name, or the code."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} (signal {-code})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code} (os._exit, exit() or a fatal error in native code)"
