"""The ABI's manifest: every op, dtype, node field and runtime signature, as checked-in JSON.

tests/abi/test_manifest.py fails when the code and manifest.json differ, and `--write` refuses to
record a changed ABI under a version that already has a recorded form: change the ABI, bump
ABI_VERSION, then run `python -m portkit.abi.manifest --write`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import sys
from pathlib import Path

from portkit.abi import ABI_VERSION, backend, dtypes, kernel, matrix, ops

PATH = Path(__file__).with_name("manifest.json")


def current() -> dict:
    """The ABI as the code defines it now."""
    from portkit.abi import spec

    def fields(cls) -> dict:
        return {f.name: str(f.type) for f in dataclasses.fields(cls)}

    def methods(cls) -> dict:
        return {name: str(inspect.signature(fn)) for name, fn in sorted(vars(cls).items())
                if callable(fn) and (not name.startswith("_") or name == "__call__")}

    return {
        "ops": {group: [op.name for op in members] for group, members in (
            ("unary", ops.UNARY), ("binary", ops.BINARY), ("ternary", ops.TERNARY),
            ("conversion", ops.CONVERSION), ("structural", ops.STRUCTURAL))},
        "optional_ops": sorted(op.name for op in ops.OPTIONAL),
        "domains": {op.name: [d.name for d in ds] for op, ds in ops.DOMAIN.items()},
        "dtypes": {d.name: [d.itemsize, d.kind] for d in dtypes.ALL},
        "var_dtypes": [d.name for d in kernel.VAR_DTYPES],
        "node": fields(kernel.Node),
        "kernel": fields(kernel.Kernel),
        "capabilities": fields(backend.Capabilities),
        "matrix_unit": fields(matrix.MatrixUnit),
        "device": fields(backend.Device),
        "backend": fields(backend.Backend),
        "launch": fields(backend.Launch),
        "runtime": {cls.__name__: methods(cls) for cls in (
            backend.Renderer, backend.Compiler, backend.Program, backend.Allocator,
            backend.HostAllocator, backend.Batch, backend.OneByOne)},
        "budgets": spec.budget_table(),
    }


def digest(content: dict) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def checked_in() -> dict:
    return json.loads(PATH.read_text())


def write() -> None:
    """Records the current ABI under ABI_VERSION; refuses to rewrite a released version."""
    content = current()
    history = checked_in()["history"] if PATH.exists() else {}
    if history.get(ABI_VERSION, digest(content)) != digest(content):
        sys.exit(f"the ABI changed but ABI_VERSION is still {ABI_VERSION}: bump it in "
                 "portkit/abi/version.py, then run this again")
    history[ABI_VERSION] = digest(content)
    PATH.write_text(json.dumps({"abi_version": ABI_VERSION, "history": history,
                                "abi": content}, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m portkit.abi.manifest --write")
    write()
