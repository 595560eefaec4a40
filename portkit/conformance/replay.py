"""Reproduction files: one failing kernel case as JSON, replayable on any backend.

The file holds the ABI kernel (exact JSON), every buffer's initial contents and the checks with
their expected values, all arrays as base64 of their raw bytes, so a replay needs neither the
generator nor the seed: `portkit replay FILE --backend NAME`.
"""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

from portkit.abi import Kernel, dtypes
from portkit.conformance.case import Check, KernelCase, Verdict, judge
from portkit.conformance.target import Target

FORMAT = "portkit-conformance-repro"
VERSION = 1


def _encode(array: np.ndarray) -> dict:
    dtype = dtypes.from_numpy(array.dtype)
    return {"dtype": dtype.name, "size": int(array.size),
            "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}


def _decode(data: dict) -> np.ndarray:
    raw = base64.b64decode(data["data"])
    return np.frombuffer(raw, dtypes.by_name(data["dtype"]).np).copy()


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
    """Reads a reproduction file: the kernel case and its metadata (case id, backend)."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
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


def replay(kc: KernelCase, target: Target) -> list[Verdict]:
    """Reruns a loaded case on `target`; one verdict per checked output."""
    kernel = target.prepare(kc.kernel)
    outputs = target.run(kernel, kc.inputs, kc.scalars)
    return [judge(check, outputs[check.output], kc.inputs) for check in kc.checks]
