"""What a device implements: four small parts and a table of capabilities.

    Renderer   kernel -> source text         Compiler  source -> binary bytes
    Program    binary -> launchable kernel   Allocator device memory and copies
    Batch      a recorded list of launches, replayed in one submission (optional)

`HostAllocator` is the Allocator of every device whose memory is the host's (the CPU backend,
the interpreter, the conformance shims).

A backend package exposes one `Backend` through the `portkit.backends` entry point group. Its
`load()` raises BackendUnavailable (with the fix) when the driver or device is missing here; a
backend with several devices also says how many (`Backend.devices`) and loads each by index.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.errors import CapabilityError, CompileError
from portkit.abi.kernel import Dim3, Kernel, Signature
from portkit.abi.matrix import MatrixUnit
from portkit.abi.ops import COMPUTE, REQUIRED, Op


@dataclass(frozen=True)
class Capabilities:
    """What a device can do. Codegen and conformance read it; nothing else is assumed."""

    dtypes: frozenset[DType]
    ops: frozenset[Op]                      # compute ops the device runs natively
    max_block_threads: int                  # threads per workgroup, all axes together
    max_block: Dim3                         # threads per workgroup, per axis
    max_grid: Dim3                          # workgroups per axis
    local_memory_bytes: int                 # workgroup memory (LOCAL) per workgroup; 0: none
    max_buffers: int                        # PARAMs one kernel may take
    denormals: Literal["preserve", "flush"] = "preserve"   # for float16/float32 results
    # True where a workgroup's threads run one after another (a CPU, a simulator): codegen then
    # gives each group one thread and a long contiguous chunk that the compiler vectorizes.
    threads_are_loops: bool = False
    # Loop iterations one thread may run in all, every loop of a kernel counted together
    # (lavapipe stops a shader after 65,535); codegen keeps every reduce stage within it.
    # None: no limit.
    max_loop_trips: int | None = None
    # The longest kernel name (`Kernel.name`) the device's compiler and driver take (PoCL
    # aborted past 252 characters); the runtime hands the backend a longer name as its start
    # and a hash. None: no limit.
    max_name_length: int | None = None
    # The largest buffer the device allocates and binds to a kernel, in bytes (WebGPU's
    # maxStorageBufferBindingSize, OpenCL's CL_DEVICE_MAX_MEM_ALLOC_SIZE); the scheduler
    # refuses a larger tensor before allocating. None: no limit but memory.
    max_buffer_bytes: int | None = None
    # The matrix units (tensor cores, NPU arrays) the device runs MMA nodes on, each with its
    # tile shape, dtypes and thread layout (portkit/abi/matrix.py). Empty: none, and codegen
    # writes scalar code only.
    matrix_units: tuple[MatrixUnit, ...] = ()
    # Scalar arguments (VARs, one 32-bit word each) one launch takes: Vulkan guarantees 128
    # bytes of push constants, 32 words (lavapipe silently ran 40). The scheduler gives a
    # kernel at most this many and writes further numbers as code. None: no limit.
    max_scalars: int | None = None
    # The vector registers one thread computes in: (how many, bytes each), e.g. (16, 32) for
    # AVX2's ymm registers, (32, 64) for AVX-512's zmm. Codegen sizes a one-thread-per-group
    # device's register blocks to them (codegen/plan.py `register_block`). None: not stated,
    # and codegen assumes AVX-512's.
    vector_registers: tuple[int, int] | None = None
    # Workgroups the device runs at once (a GPU's multiprocessors or compute units): where it
    # states them, codegen on hardware lanes gives a kernel of few outputs enough workgroups
    # to fill them (codegen/tiles.py `choose`, codegen/groups.py). None: not stated, and
    # codegen makes the workgroups it would make for any device.
    compute_units: int | None = None
    peak_gflops: float | None = None        # float32, for the performance tier
    peak_bandwidth_gbs: float | None = None
    device_name: str = ""

    def validate(self, backend: str) -> Capabilities:
        """Raises CapabilityError naming what is missing or malformed."""
        def fail(message: str) -> CapabilityError:
            return CapabilityError(f"backend {backend!r}: {message}")

        missing = sorted(op.name for op in REQUIRED - self.ops)
        if missing:
            raise fail(f"declares no support for required ops {missing}; implement them in "
                       "the renderer (only ops in portkit.abi.ops.OPTIONAL may be left out)")
        unknown = [op for op in self.ops if op not in COMPUTE]
        if unknown:
            raise fail(f"`ops` lists non-compute ops {unknown}; list compute ops only")
        for required in (dtypes.bool_, dtypes.int32, dtypes.float32):
            if required not in self.dtypes:
                raise fail(f"must support {required}: indices, masks and default floats use it")
        if self.denormals not in ("preserve", "flush"):
            raise fail(f"denormals must be 'preserve' or 'flush', got {self.denormals!r}")
        for name in ("max_block", "max_grid"):
            dims = getattr(self, name)
            if len(dims) != 3 or min(dims) < 1:
                raise fail(f"{name} must be 3 positive ints, got {dims}")
        if self.max_block_threads < 1 or self.max_buffers < 2 or self.local_memory_bytes < 0:
            raise fail("max_block_threads must be >= 1, max_buffers >= 2, "
                       "local_memory_bytes >= 0")
        for name, least in (("max_loop_trips", 64), ("max_name_length", 16),
                            ("max_buffer_bytes", 1), ("max_scalars", 0), ("compute_units", 1)):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= least):
                raise fail(f"{name} must be None (no limit) or an int >= {least}, got {value!r}")
        registers = self.vector_registers
        if registers is not None and not (
                isinstance(registers, tuple) and len(registers) == 2
                and all(isinstance(x, int) and x >= least for x, least in zip(registers, (1, 4)))):
            raise fail("vector_registers must be None or (how many >= 1, bytes each >= 4), "
                       f"got {registers!r}")
        self._validate_matrix_units(fail)
        return self

    def _validate_matrix_units(self, fail: Callable[[str], CapabilityError]) -> None:
        if not isinstance(self.matrix_units, tuple) or not all(
                isinstance(u, MatrixUnit) for u in self.matrix_units):
            raise fail("matrix_units must be a tuple of portkit.abi.matrix.MatrixUnit, got "
                       f"{self.matrix_units!r}")
        for unit in self.matrix_units:
            found = unit.problems()
            if found:
                raise fail(f"matrix unit {unit.m}x{unit.n}x{unit.k} is malformed: "
                           + "; ".join(found) + " (build its layout with "
                           "portkit.abi.matrix.fragment)")
            lacking = sorted({unit.a_dtype.name, unit.b_dtype.name, unit.acc_dtype.name}
                             - {d.name for d in self.dtypes})
            if lacking:
                raise fail(f"matrix unit {unit.name} uses dtypes {lacking} that `dtypes` "
                           "does not declare")
            if unit.threads > self.max_block_threads:
                raise fail(f"matrix unit {unit.name} takes {unit.threads} threads, more than "
                           f"max_block_threads ({self.max_block_threads})")

    def check_launch(self, kernel: Kernel) -> None:
        """Raises CapabilityError if this device cannot launch `kernel` as written."""
        threads = kernel.block[0] * kernel.block[1] * kernel.block[2]
        problems = []
        if threads > self.max_block_threads or any(
                b > m for b, m in zip(kernel.block, self.max_block)):
            problems.append(f"block {kernel.block} exceeds {self.max_block} / "
                            f"{self.max_block_threads} threads")
        if any(g > m for g, m in zip(kernel.grid, self.max_grid)):
            problems.append(f"grid {kernel.grid} exceeds {self.max_grid}")
        if self.max_name_length is not None and len(kernel.name) > self.max_name_length:
            problems.append(f"its name of {len(kernel.name)} characters exceeds "
                            f"{self.max_name_length} (Runtime.prepare shortens it)")
        if len(kernel.params) > self.max_buffers:
            problems.append(f"{len(kernel.params)} buffers exceed the limit of "
                            f"{self.max_buffers}")
        if self.max_scalars is not None and len(kernel.vars) > self.max_scalars:
            problems.append(f"{len(kernel.vars)} scalar arguments exceed the limit of "
                            f"{self.max_scalars} (Capabilities.max_scalars)")
        local = sum(n.arg * n.value_dtype.itemsize for n in kernel.nodes if n.op is Op.LOCAL)
        if local > self.local_memory_bytes:
            problems.append(f"{local} bytes of LOCAL memory exceed {self.local_memory_bytes}")
        lacking = sorted({n.dtype.name for n in kernel.nodes if n.dtype} -
                         {d.name for d in self.dtypes})
        if lacking:
            problems.append(f"dtypes {lacking} are not supported")
        ops = sorted({n.op.name for n in kernel.nodes if n.op in COMPUTE} -
                     {op.name for op in self.ops})
        if ops:
            problems.append(f"ops {ops} are not native; decompose them first "
                            "(portkit.codegen.decompose)")
        units = sorted({n.arg.name for n in kernel.nodes if n.op is Op.MMA
                        and n.arg not in self.matrix_units})
        if units:
            problems.append(f"matrix units {units} are not among the device's matrix_units")
        if problems:
            raise CapabilityError(f"kernel {kernel.name!r} cannot run on this device: "
                                  + "; ".join(problems))


class Renderer(ABC):
    """Turns an ABI kernel into the device's source language."""

    @abstractmethod
    def render(self, kernel: Kernel) -> str: ...


class Compiler(ABC):
    """Turns source into a binary. `cache_key` changes whenever the same source could compile
    differently (compiler version, flags, target), so binaries can be cached on disk."""

    cache_key: str = ""

    @abstractmethod
    def compile(self, source: str) -> bytes: ...

    def compile_batch(self, sources: list[str]) -> list[bytes | CompileError]:
        """Optional (ABI 0.6): many sources at once, one result per source in order: its
        binary, or the CompileError of that source alone. Each binary is what `compile` of
        that source would make a Program of, and may be shared: one library holding every
        source's kernel, each Program finding its own by the kernel's name. A compiler that
        builds the batch as one unit and cannot tell which source failed raises CompileError
        for the whole batch; the runtime then compiles those sources one by one. This default
        compiles them one by one."""
        results: list[bytes | CompileError] = []
        for source in sources:
            try:
                results.append(self.compile(source))
            except CompileError as error:
                results.append(error)
        return results


class Program(ABC):
    """A compiled kernel, ready to launch."""

    @abstractmethod
    def __call__(self, buffers: list[Any], scalars: list[int], grid: Dim3, block: Dim3,
                 wait: bool = False) -> float | None:
        """Launches; with `wait`, blocks until done and returns the kernel's seconds. `scalars`
        are the VARs' 32-bit words as signed ints (`scalar_words`), whatever their dtype."""


@dataclass
class Launch:
    """One launch of a batch: a program, its buffers (allocator handles), its scalars' 32-bit
    words, and its grid and block, as `Program.__call__` takes them."""

    program: Program
    buffers: list[Any]
    scalars: list[int]
    grid: Dim3
    block: Dim3


class Batch(ABC):
    """Launches recorded once and replayed, all of them in order, in one submission (ABI 0.7;
    made by `Device.batch`). Each launch sees the writes of the launches before it in the
    batch and of the work submitted before the replay; a copy, read-back or launch after a
    replay sees all of its writes."""

    @abstractmethod
    def __call__(self, buffers: Sequence[tuple[int, int, Any]] = (),
                 scalars: Sequence[tuple[int, list[int]]] = (), wait: bool = False
                 ) -> float | None:
        """Replays every launch. First each (launch, position, handle) of `buffers` replaces
        that launch's buffer at that position, and each (launch, words) of `scalars` that
        launch's scalar words, for this replay and the later ones. With `wait`, blocks until
        done and returns the seconds the whole batch took."""


class OneByOne(Batch):
    """The default Batch: each launch through its own Program, one submission each."""

    def __init__(self, launches: list[Launch]):
        self.launches = [Launch(launch.program, list(launch.buffers), list(launch.scalars),
                                launch.grid, launch.block) for launch in launches]

    def __call__(self, buffers: Sequence[tuple[int, int, Any]] = (),
                 scalars: Sequence[tuple[int, list[int]]] = (), wait: bool = False
                 ) -> float | None:
        self._substitute(buffers, scalars)
        seconds = 0.0
        for launch in self.launches:
            seconds += launch.program(launch.buffers, launch.scalars, launch.grid,
                                      launch.block, wait=wait) or 0.0
        return seconds if wait else None

    def _substitute(self, buffers: Sequence[tuple[int, int, Any]],
                 scalars: Sequence[tuple[int, list[int]]]) -> None:
        """Puts a replay's replacements into the launches, for it and the later replays."""
        for index, position, handle in buffers:
            self.launches[index].buffers[position] = handle
        for index, words in scalars:
            self.launches[index].scalars = list(words)


class Allocator(ABC):
    """Device memory. Buffers are opaque handles; sizes are in bytes."""

    @abstractmethod
    def alloc(self, nbytes: int) -> Any: ...

    @abstractmethod
    def free(self, buffer: Any, nbytes: int) -> None: ...

    @abstractmethod
    def copyin(self, buffer: Any, source: memoryview) -> None:
        """Host -> device: copies all of `source` to the start of `buffer`."""

    @abstractmethod
    def copyout(self, destination: memoryview, buffer: Any) -> None:
        """Device -> host: fills all of `destination` from the start of `buffer`; waits."""


class HostAllocator(Allocator):
    """Host memory: a buffer is a numpy byte array. For devices that compute in host memory."""

    def alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, np.uint8)   # a new buffer's contents are undefined in the ABI

    def free(self, buffer: np.ndarray, nbytes: int) -> None:
        pass   # numpy frees the array with its last reference

    def copyin(self, buffer: np.ndarray, source: memoryview) -> None:
        data = np.frombuffer(source, np.uint8)
        buffer[:data.size] = data

    def copyout(self, destination: memoryview, buffer: np.ndarray) -> None:
        out = np.frombuffer(destination, np.uint8)
        out[:] = buffer[:out.size]


def host_peer_copy(destination: np.ndarray, source_device: Device, source: Any,
                   nbytes: int) -> bool:
    """`Device.peer_copy` of a host-memory device: one memcpy from another host-memory
    device's buffer; False from any other device (the runtime then goes through the host)."""
    if not isinstance(source_device.allocator, HostAllocator):
        return False
    destination[:nbytes] = source[:nbytes]
    return True


def synchronous() -> None:
    """`Device.synchronize` of a device whose launches finish before they return."""


@dataclass
class Device:
    """A loaded backend: its parts, bound to one device.

    `program(kernel name, binary)` makes a Program: a Program class, or a `functools.partial`
    of one that binds the device's handles (context, queue). `synchronize()` waits for all
    launched work. `batch(launches)` (ABI 0.7) makes a Batch of programs it made; the default,
    `OneByOne`, launches each in turn.
    `signed_program(kernel name, binary, signature)`, where set, makes programs instead of
    `program`.
    """

    name: str
    capabilities: Capabilities
    allocator: Allocator
    renderer: Renderer
    compiler: Compiler
    program: Callable[[str, bytes], Program]
    synchronize: Callable[[], None] = synchronous
    # Optional (ABI 0.7): peer_copy(destination, source device, source buffer, nbytes) copies
    # `nbytes` from another device's buffer into this device's `destination` without the
    # host's help and returns True, or returns False where it cannot copy from that device
    # (another backend, another context); the runtime then copies through the host.
    peer_copy: Callable[[Any, Device, Any, int], bool] | None = None
    batch: Callable[[list[Launch]], Batch] = OneByOne
    # Optional (ABI 0.7): used instead of `program` when set, and given the kernel's Signature
    # too, for APIs that declare a pipeline's layout before they build it (Vulkan).
    signed_program: Callable[[str, bytes, Signature], Program] | None = None

    def make_program(self, kernel: Kernel, binary: bytes) -> Program:
        """The Program of `kernel` compiled to `binary`: through `signed_program` if set."""
        if self.signed_program is not None:
            return self.signed_program(kernel.name, binary, kernel.signature)
        return self.program(kernel.name, binary)


@dataclass(frozen=True)
class Backend:
    """What the `portkit.backends` entry point names: a name, how to load the device, and the
    ABI version the backend implements ("0.10"; portkit refuses to load an incompatible one).

    `load()` returns the Device, or raises BackendUnavailable naming the fix. A backend with
    several devices (ABI 0.7) gives `devices`, which returns how many there are here, and a
    `load(index)` that loads device `index` (0 to devices() - 1); portkit calls `load()` with no
    argument for device 0, so a one-device backend's `load` takes none.
    """

    name: str
    load: Callable[..., Device]
    description: str = ""
    abi_version: str = ""
    devices: Callable[[], int] | None = None
