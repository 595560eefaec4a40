"""The on-disk cache of compiled kernels: $PORTKIT_CACHE, else ~/.cache/portkit.

Entries are keyed by the backend, the compiler's cache_key (version, flags, target) and the
source, and written atomically (a temporary file renamed into place), so processes sharing the
cache never read half a file.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from portkit.abi.backend import Compiler


def directory() -> Path:
    """The cache's root folder (it may not exist yet)."""
    return Path(os.environ.get("PORTKIT_CACHE") or Path.home() / ".cache" / "portkit")


def compile_cached(backend: str, compiler: Compiler, source: str) -> bytes:
    """compiler.compile(source), read from the disk cache when the same build was done before."""
    if not compiler.cache_key:   # a compiler that cannot say what it builds for is not cached
        return compiler.compile(source)
    identity = f"{backend}\0{compiler.cache_key}\0{source}"
    key = hashlib.sha256(identity.encode()).hexdigest()
    path = directory() / backend / f"{key}.bin"
    try:
        return path.read_bytes()
    except OSError:
        pass
    binary = compiler.compile(source)
    write_atomic(path, binary)
    return binary


def write_atomic(path: Path, data: bytes) -> bool:
    """Writes `data` to `path` through a rename; False (and no file) if the disk refuses."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as file:
            tmp = file.name
            file.write(data)
        os.replace(tmp, path)
        return True
    except OSError:   # a read-only or full disk only costs a recompile
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
