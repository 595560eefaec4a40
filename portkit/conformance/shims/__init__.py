"""Host shims: rendered MSL and CUDA C compiled as host C++ and run, for tests without a GPU.

A test tool, never a user backend: `shim_device("metal")` is a Device whose renderer is the real
MetalRenderer, whose compiler is clang++ with a small header that stands in for the language
(`metal_stdlib`, `cuda_shim.h`), and whose programs run the grid on the host (pk_shim_runtime.h).
It checks what the renderer writes (expressions, casts, rounding, wrapping, indexing, barriers),
not what a GPU compiler or a GPU does with it: see docs/backends/metal.md and cuda.md.

Compiling one kernel per clang++ run costs ~0.3 s, so `compile_batch` (the ABI's batched
compile, which Runtime.compile_all calls with each core's share) puts many kernels into one
translation unit, each in a namespace of its own.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from portkit.abi import (
    BackendUnavailable,
    Capabilities,
    CompileError,
    Compiler,
    Device,
    HostAllocator,
    Kernel,
    Program,
    Renderer,
    dtypes,
)
from portkit.abi.ops import COMPUTE

HEADERS = Path(__file__).parent
FLAGS = ("-std=c++20", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math",
         "-Wno-unknown-attributes", "-Wno-user-defined-literals", "-w")


@dataclass(frozen=True)
class Language:
    """How one language's source becomes host C++: its header and its kernel signature."""

    name: str
    include: tuple[str, ...]      # extra compiler arguments
    barrier: str                  # text present in the source when the kernel has a BARRIER
    kernel_prefix: str            # removed in a batch: extern "C" names would collide
    thread_ids: str               # extra launch-stub arguments after buffers and scalars


LANGUAGES = {
    "metal": Language("metal", ("-I", str(HEADERS)),
                      "threadgroup_barrier(", "",
                      ", metal::uint3{i.group.x, i.group.y, i.group.z}, "
                      "metal::uint3{i.thread.x, i.thread.y, i.thread.z}"),
    "cuda": Language("cuda", ("-I", str(HEADERS), "-include", "cuda_shim.h"),
                     "__syncthreads()", 'extern "C" ', ""),
}
_GUARD = re.compile(r"^#ifndef (PK_ONCE_\w+)", re.MULTILINE)
_SIGNATURE = re.compile(r"void (?:__launch_bounds__\(\d+\) )?(k_\w+)\(([^{]*)\)\s*\{")


def _stub(language: Language, source: str, entry: str) -> str:
    """An extern "C" entry point that runs the source's kernel over a grid."""
    match = _SIGNATURE.search(source)
    if match is None:
        raise CompileError("no kernel function found in the source", source)
    name, args = match.groups()
    buffers = len(re.findall(r"\*\s*data\d+", args))
    scalars = ["s"] if "pk_vars" in args else [f"s[{i}]" for i in
                                                range(len(re.findall(r"\bvar_\w+", args)))]
    call = [f"pk_shim::Ptr{{b[{i}]}}" for i in range(buffers)] + scalars
    barriers = "true" if language.barrier in source else "false"
    return (f'extern "C" void {entry}(void **b, const int32_t *s, const int32_t *dims) {{\n'
            f"  pk_shim::launch(dims, {barriers}, [&](const pk_shim::Ids &i) {{\n"
            f"    (void)i;\n    {name}({', '.join(call)}{language.thread_ids});\n  }});\n}}\n")


def entry_name(source: str) -> str:
    """The launch stub's symbol for a source: unique per source text."""
    return "pk_entry_" + hashlib.sha256(source.encode()).hexdigest()[:20]


class ShimCompiler(Compiler):
    """clang++ on the source plus a launch stub; `compile_batch` builds many in one unit."""

    cache_key = ""   # libraries live in this object, not in portkit's disk cache

    def __init__(self, language: Language, workdir: Path):
        self.language, self.workdir = language, workdir
        self.command = shutil.which("clang++")
        if self.command is None:
            raise BackendUnavailable("the host shims need clang++", "apt-get install clang")
        self.libraries: dict[str, ctypes.CDLL] = {}   # entry name -> library holding it
        self._lock = threading.Lock()

    def compile(self, source: str) -> bytes:
        return self.compile_batch([source])[0]

    def compile_batch(self, sources: list[str]) -> list[bytes | CompileError]:
        """Builds every source not built yet as one translation unit (each kernel in a
        namespace of its own); each binary is its source's entry name. Raises CompileError
        if the unit fails: the runtime then compiles the sources one by one."""
        todo = {entry_name(s): s for s in sources if entry_name(s) not in self.libraries}
        if todo:
            library = self._build(list(todo.items()))
            with self._lock:
                self.libraries.update(dict.fromkeys(todo, library))
        return [entry_name(s).encode() for s in sources]

    def _build(self, chunk: list[tuple[str, str]]) -> ctypes.CDLL:
        text = self._batch(chunk) if len(chunk) > 1 else (
            chunk[0][1] + _stub(self.language, chunk[0][1], chunk[0][0]))
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        output = self.workdir / f"{self.language.name}-{digest}.so"
        result = subprocess.run([self.command, *FLAGS, *self.language.include, "-x", "c++", "-",
                                 "-o", str(output)], input=text, capture_output=True, text=True,
                                check=False)
        if result.returncode != 0:
            raise CompileError(f"clang++ rejected the {self.language.name} shim build",
                               text, result.stderr)
        return ctypes.CDLL(str(output))

    def _batch(self, chunk: list[tuple[str, str]]) -> str:
        parts = ["#include <metal_stdlib>" if self.language.name == "metal" else ""]
        for number, (entry, source) in enumerate(chunk):
            if self.language.kernel_prefix:
                source = source.replace(self.language.kernel_prefix, "")
            # a helper a renderer guards (#ifndef PK_ONCE_...) is needed in every namespace
            parts += [f"#undef {guard}" for guard in _GUARD.findall(source)]
            parts.append(f"namespace pk_kernel_{number} {{\n{source}\n"
                         f"{_stub(self.language, source, entry)}}}\n")
        return "\n".join(parts)


class ShimProgram(Program):
    """One kernel's launch stub in a host library; runs synchronously."""

    def __init__(self, compiler: ShimCompiler, name: str, binary: bytes):
        function = getattr(compiler.libraries[binary.decode()], binary.decode())
        function.argtypes = [ctypes.c_void_p] * 3
        self.function = function

    def __call__(self, buffers: list[np.ndarray], scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        pointers = (ctypes.c_void_p * max(len(buffers), 1))(*[b.ctypes.data for b in buffers])
        values = np.array(list(scalars) or [0], np.int32)
        dims = np.array([*grid, *block], np.int32)
        self.function(pointers, values.ctypes.data, dims.ctypes.data)
        return None


def _prepared(capabilities: Capabilities, kernels: Sequence[Kernel]) -> list[Kernel]:
    """`kernels` as a device with `capabilities` runs them (decomposed, checked); those it
    declares unsupported (a dtype it lacks) are left out."""
    from portkit.conformance.case import Unsupported
    from portkit.conformance.target import Target

    target = Target(Device("probe", capabilities, None, None, None, None))
    prepared = []
    for kernel in kernels:
        try:
            prepared.append(target.prepare(kernel))
        except Unsupported:
            pass
    return prepared


def conformance_kernels(capabilities: Capabilities, quick: bool = False) -> list[Kernel]:
    """The kernels of the ABI-op and kernel tiers (2 and 3) as a device with `capabilities`
    runs them (decomposed, checked); cases it declares unsupported are left out."""
    from portkit.conformance import tier2_ops, tier3_kernels
    from portkit.conformance.case import Context

    context = Context(capabilities, quick=quick)
    cases = tier2_ops.cases(context) + tier3_kernels.cases(context)
    return _prepared(capabilities, [case.make().kernel for case in cases if case.make])


class _Recorder(Renderer):
    """A renderer that keeps every kernel it is given, then renders it as `inner` does."""

    def __init__(self, inner: Renderer):
        self.inner, self.kernels = inner, []

    def render(self, kernel: Kernel) -> str:
        self.kernels.append(kernel)
        return self.inner.render(kernel)


@functools.cache
def _tensor_graph_kernels() -> tuple[Kernel, ...]:
    """Every kernel of tiers 4 and 5 (all dtypes, full size), lowered for the interpreter: a
    many-threads device, so the stack's GPU-style lowering. Tier 4's come from its graphs
    (nothing runs); tier 5's are recorded while the models run on the interpreter, since the
    MLP reads each step's loss before building the next."""
    from portkit.conformance import tier4_tensor as t4
    from portkit.conformance import tier5_models as t5
    from portkit.conformance.case import Context
    from portkit.conformance.target import Target
    from portkit.reference_backends import interpreter

    found: list[Kernel] = []
    planner = t4.stack_device(t4.interpreter_target())
    context = Context(interpreter.backend.load().capabilities)
    for op in t4.OPS:
        for dtype in map(dtypes.by_name, op.dtypes):
            rng = context.rng(f"tensor/{op.name}/{dtype.name}")
            inputs, is_float = t4.case_inputs(op, dtype, rng)
            w = (rng.standard_normal(t4.oracle_shape(op, inputs))
                 if t4.differentiable(op, dtype) else None)
            forward, backward = t4.run_op(op, dtype, inputs, is_float, w, planner,
                                          plan=True).kernels
            found += forward + backward
    device = interpreter.backend.load()
    recorder = _Recorder(device.renderer)
    recording = t4.stack_device(Target(replace(device, renderer=recorder), "shim-recorder"))
    for model in t5.models(quick=False):
        weights = model.weights(context.rng(f"models/{model.name}/float32"))
        model.run(weights, recording, dtypes.float32, False)
    found += recorder.kernels
    return tuple({k.to_json(): k for k in found}.values())


def tensor_kernels(capabilities: Capabilities) -> list[Kernel]:
    """The distinct kernels of the Tensor-op and model tiers (4 and 5), lowered as for the
    interpreter, as a device with `capabilities` runs them; unsupported ones are left out."""
    return _prepared(capabilities, _tensor_graph_kernels())


def run_conformance(device: Device, quick: bool = False, jobs: int = 2):
    """Tiers 1-3 on a shim device; each tier's kernels are built first, in `jobs` batches
    (Runtime.compile_all, through `ShimCompiler.compile_batch`)."""
    from portkit.conformance import Options, Target, run

    return run(Target(device, device.name), Options(tiers=(1, 2, 3), quick=quick, jobs=jobs))


def shim_device(language: str, workdir: Path | None = None) -> Device:
    """A Device that renders with the real `language` renderer and runs on the host."""
    from portkit.reference_backends.cuda.renderer import CUDARenderer
    from portkit.reference_backends.metal.renderer import MetalRenderer

    renderer: Renderer = {"metal": MetalRenderer, "cuda": CUDARenderer}[language]()
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"portkit-{language}-shim-"))
    compiler = ShimCompiler(LANGUAGES[language], workdir)
    return Device(f"{language}-shim", shim_capabilities(language), HostAllocator(), renderer,
                  compiler, functools.partial(ShimProgram, compiler))


def shim_capabilities(language: str) -> Capabilities:
    """What a shim device of `language` declares: a typical GPU of that kind. Needs no clang++."""
    from portkit.reference_backends.metal.capabilities import capabilities

    if language == "metal":
        return capabilities(device_name="MSL host shim (clang++)")
    return Capabilities(dtypes=frozenset(dtypes.ALL), ops=frozenset(COMPUTE),
                        max_block_threads=1024, max_block=(1024, 1024, 64),
                        max_grid=(2**31 - 1, 65535, 65535), local_memory_bytes=48 * 1024,
                        max_buffers=256, compute_units=108,   # an A100's multiprocessors
                        device_name="CUDA C host shim (clang++)")
