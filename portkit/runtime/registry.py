"""The runtimes of this process, one per device name, and what `clear()` empties."""
from __future__ import annotations

from collections.abc import Callable

from portkit import backends, settings
from portkit.abi import BackendUnavailable
from portkit.runtime.device import Runtime

_on_clear: list[Callable[[], None]] = []


def on_clear(forget: Callable[[], None]) -> None:
    """Registers `forget`, called by `clear()`: layers above keep caches of their own."""
    _on_clear.append(forget)


def clear() -> None:
    """Frees what portkit holds in memory: every runtime's compiled kernels and pooled
    buffers, and the caches registered through `on_clear` (the scheduler's lowered kernels).
    Tensors already realized keep their buffers."""
    for forget in _on_clear:
        forget()
    for found in list(_runtimes.values()):
        found.clear()


def default_device() -> str:
    """The device a Tensor gets when none is named: $PORTKIT_DEVICE, else "cpu"."""
    return settings.read("PORTKIT_DEVICE")


def device_name(name: str | None = None) -> str:
    """`name` in its one spelling ("cpu:0" is "cpu"), or `default_device()`'s when it is None,
    checked where a tensor op names it: an unknown name raises backends.UnknownBackend (a
    RuntimeError, with the closest name), an index past the backend's devices NoSuchDevice, a
    backend that cannot load here BackendUnavailable; a name taken from $PORTKIT_DEVICE says so."""
    if name is not None:
        return get(name).name
    try:
        return get().name
    except BackendUnavailable as error:
        error.args = (f"{error} (the name comes from the PORTKIT_DEVICE setting)",)
        raise


_runtimes: dict[str, Runtime] = {}


def get(name: str | None = None) -> Runtime:
    """The runtime of device `name` ("opencl", "opencl:1"; default: `default_device()`), made
    once per device: "cpu" and "cpu:0" are one runtime, named "cpu"."""
    name = name or default_device()
    found = _runtimes.get(name)
    if found is None:
        name = backends.canonical(name)
        found = _runtimes.get(name)
        if found is None:
            found = _runtimes.setdefault(name, Runtime(name, backends.load(name)))
    return found


def register(runtime: Runtime) -> Runtime:
    """Makes `get(runtime.name)` return `runtime`: a device handed in directly (a backend under
    test, not loaded by name) becomes reachable by name. Raises ValueError if that name is
    already taken by another runtime."""
    found = _runtimes.setdefault(runtime.name, runtime)
    if found is not runtime:
        raise ValueError(f"a runtime named {runtime.name!r} exists already; pick another name")
    return runtime
