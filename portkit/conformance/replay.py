"""Reproduction files: one failing kernel case as JSON, replayable on any backend.

The file holds the ABI kernel (exact JSON), every buffer's initial contents and the checks with
their expected values, all arrays as base64 of their raw bytes, so a replay needs neither the
generator nor the seed: `portkit replay FILE --backend NAME`.
"""
from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path

import numpy as np

from portkit.abi import Kernel, dtypes
from portkit.abi.errors import InvalidKernel, PortkitError
from portkit.abi.interpreter import OutOfBounds
from portkit.abi.interpreter import run as interpret
from portkit.abi.ops import COMPUTE
from portkit.conformance.case import Check, KernelCase, Verdict, judge
from portkit.conformance.target import Target

FORMAT = "portkit-conformance-repro"
VERSION = 1


class ReplayError(PortkitError, ValueError):
    """A reproduction file that cannot be replayed: malformed, or its kernel would touch
    memory outside its buffers (undefined on a device: a native launch could corrupt the
    process)."""


def _encode(array: np.ndarray) -> dict:
    dtype = dtypes.from_numpy(array.dtype)
    return {"dtype": dtype.name, "size": int(array.size),
            "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}


def _decode(data: dict) -> np.ndarray:
    array = np.frombuffer(base64.b64decode(data["data"], validate=True),
                          dtypes.by_name(data["dtype"]).np).copy()
    if array.size != data["size"]:
        raise ValueError(f"an array says it holds {data['size']} elements but holds {array.size}")
    return array


def save(path: str | Path, kc: KernelCase, case_id: str, backend: str) -> Path:
    """Writes `kc` (from case `case_id`, failing on `backend`) to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    checks = [{
        "output": c.output, "kind": c.kind, "count": c.count, "op": c.op, "dtype": c.dtype,
        "expected": [_encode(e) for e in c.expected],
        "mask": None if c.mask is None else _encode(np.asarray(c.mask)),
        "bound": None if c.bound is None else _encode(c.bound),
        "operands": list(c.operands), "labels": c.labels,
    } for c in kc.checks]
    path.write_text(json.dumps({
        "format": FORMAT, "version": VERSION, "case": case_id, "backend": backend,
        "kernel": json.loads(kc.kernel.to_json()), "scalars": list(kc.scalars),
        "inputs": [_encode(a) for a in kc.inputs], "checks": checks,
    }, indent=1))
    return path


def load(path: str | Path) -> tuple[KernelCase, dict]:
    """Reads a reproduction file: the kernel case and its metadata (case id, backend).
    Raises ReplayError, in one line, for a file that is not one or is damaged."""
    try:
        return _load(path)
    except InvalidKernel as error:
        raise ReplayError(f"{path} holds a malformed kernel: {error}; save the case again with "
                          "`portkit conform --repro-dir`") from None
    except (KeyError, TypeError, AttributeError, IndexError, binascii.Error,
            RecursionError) as error:
        what = f"missing key {error}" if isinstance(error, KeyError) else str(error)[:200]
        raise ReplayError(f"{path} is a malformed reproduction file ({type(error).__name__}: "
                          f"{what}); save the case again with `portkit conform --repro-dir`"
                          ) from None
    except ValueError as error:
        if isinstance(error, PortkitError):
            raise
        raise ReplayError(f"{path} is a malformed reproduction file: {str(error)[:200]}; "
                          "save the case again with `portkit conform --repro-dir`") from None


def _load(path: str | Path) -> tuple[KernelCase, dict]:
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a portkit conformance reproduction file; "
                         "pass a file from a failure's `portkit replay` line")
    checks = [Check(output=c["output"], kind=c["kind"], count=c["count"], op=c["op"],
                    dtype=c["dtype"], expected=tuple(_decode(e) for e in c["expected"]),
                    mask=None if c["mask"] is None else _decode(c["mask"]),
                    bound=None if c["bound"] is None else _decode(c["bound"]),
                    operands=tuple(c["operands"]), labels=c["labels"])
              for c in data["checks"]]
    kernel = Kernel.from_json(json.dumps(data["kernel"]))
    kc = KernelCase(kernel, [_decode(a) for a in data["inputs"]], checks,
                    tuple(data["scalars"]))
    return kc, {"case": data["case"], "backend": data["backend"]}


def check_bounds(kc: KernelCase) -> None:
    """Raises ReplayError unless the case's buffers fit its kernel: their number and dtypes,
    and every LOAD and STORE inside them (found by running it in the ABI interpreter)."""
    kernel = kc.kernel
    if len(kc.inputs) != len(kernel.params) or len(kc.scalars) != len(kernel.vars):
        raise ReplayError(f"kernel {kernel.name[:60]!r} takes {len(kernel.params)} buffers and "
                          f"{len(kernel.vars)} scalars; the file holds {len(kc.inputs)} and "
                          f"{len(kc.scalars)}")
    for param, array in zip(kernel.params, kc.inputs):
        if array.dtype != param.dtype.np:
            raise ReplayError(f"kernel {kernel.name[:60]!r}: buffer {param.arg} must hold "
                              f"{param.dtype.name}, the file has {array.dtype}")
    try:
        interpret(kernel, [a.copy() for a in kc.inputs], kc.scalars)
    except OutOfBounds as error:
        raise ReplayError(f"{error}; not launched natively (an out-of-bounds store corrupts "
                          "the process): fix the kernel or the buffer sizes") from None


def listing(kernel: Kernel) -> str:
    """`kernel` one node per line: position, op, dtype, sources and argument."""
    lines = [f"kernel {kernel.name} grid {kernel.grid} block {kernel.block}"]
    for number, node in enumerate(kernel.nodes):
        dtype = node.dtype.name if node.dtype else "-"
        source = " ".join(f"%{s}" for s in node.src)
        argument = "" if node.arg is None else f"  {node.arg!r}"
        lines.append(f"  %{number:<4} {node.op.name:8} {dtype:9} {source}{argument}".rstrip())
    return "\n".join(lines)


def describe(kc: KernelCase, target: Target) -> str:
    """What `target` makes of the case's kernel before it launches: the kernel after its
    decompositions (and which ops they replaced), and the source its renderer writes."""
    prepared = target.prepare(kc.kernel)
    note = rewritten(kc.kernel, prepared) or f"{target.name} runs every op of it natively"
    source = rendered(target, prepared) or "(the renderer raised an error)"
    return (f"{listing(prepared)}\n({note})\n\nsource rendered by {target.name}:\n"
            f"{source.rstrip()}")


def forget(path: str | Path, backend: str) -> bool:
    """Removes the reproduction file at `path` if it was saved from `backend` (its case passes
    there now, so the file is stale); True if it did. Files of other backends stay."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(saved, dict) or saved.get("format") != FORMAT or \
            saved.get("backend") != backend:
        return False
    path.unlink(missing_ok=True)
    return True


def replay(kc: KernelCase, target: Target) -> list[Verdict]:
    """Reruns a loaded case on `target`; one verdict per checked output. The buffers are
    checked against the kernel first (check_bounds), so a bad file never launches."""
    check_bounds(kc)
    kernel = target.prepare(kc.kernel)
    outputs = target.run(kernel, kc.inputs, kc.scalars)
    return [judge(check, outputs[check.output], kc.inputs) for check in kc.checks]


def rewritten(original, prepared) -> str:
    """What the device's decompositions put in a failing kernel (codegen/decompose.py): a
    wrong op among those fails this case too, under another op's name. "" if none."""
    def compute_ops(kernel) -> set[str]:
        return {node.op.name for node in kernel.nodes if node.op in COMPUTE}

    lacking = compute_ops(original) - compute_ops(prepared)
    if not lacking:
        return ""
    added = sorted(compute_ops(prepared) - compute_ops(original)) or ["the ops it already had"]
    return (f"this backend lacks {', '.join(sorted(lacking))}, so the kernel ran them "
            f"decomposed into {', '.join(added)}: if those ops' own cases fail, fix them first")


def rendered(target: Target, kernel) -> str | None:
    """`kernel`'s source as `target` renders it, or None if its renderer fails."""
    try:
        return target.device.renderer.render(kernel)
    except Exception:  # noqa: BLE001 - the failure's own message already says why
        return None
