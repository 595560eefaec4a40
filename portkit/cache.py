"""The on-disk cache of compiled kernels: $PORTKIT_CACHE, else the user's cache folder
(platformdirs: $XDG_CACHE_HOME/portkit, ~/.cache/portkit on Linux).

Entries are keyed by the backend, the compiler's cache_key (whole command, version, flags,
target) and the source, and written atomically (a temporary file renamed into place), so
processes sharing the cache never read half a file. The cache is not trusted: every entry
carries its key and the SHA-256 of its bytes, checked on load; a bad entry (truncated, flipped
bytes, another kernel's binary) is deleted, recompiled and reported once. Folders are made 0700
and a root owned by another user is not used. Past PORTKIT_CACHE_MAX_MB (default 1024) the
least recently used entries go. `portkit cache info|clear` inspects and empties it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import platformdirs

from portkit import settings
from portkit.abi.backend import Compiler
from portkit.abi.errors import CompileError

MAGIC = b"portkit-cache-1\n"
DEFAULT_MAX_MB = 1024
_WRITES_BETWEEN_CAPS = 16   # the cap walks the folder: not on every write


class CacheWarning(UserWarning):
    """A cache entry was bad (deleted and rebuilt) or the cache folder cannot be used."""


def directory() -> Path:
    """The cache's root folder (it may not exist yet)."""
    override = settings.read("PORTKIT_CACHE")
    return Path(override) if override else platformdirs.user_cache_path("portkit")


def max_bytes() -> int:
    """The size the cache is kept under: PORTKIT_CACHE_MAX_MB megabytes (default 1024)."""
    return settings.megabytes("PORTKIT_CACHE_MAX_MB")


def safe_name(name: str) -> str:
    """`name` as one folder name: a backend called `../../x` stays inside the cache."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    if cleaned != name:   # distinct names stay distinct
        cleaned += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return cleaned


_reported: set[str] = set()
_writes = 0


def _report(message: str) -> None:
    if message not in _reported:
        _reported.add(message)
        warnings.warn(f"portkit cache: {message}", CacheWarning, stacklevel=3)


def _usable(folder: Path) -> bool:
    """Makes `folder` (0700) under a root this user owns; False if the cache cannot be used."""
    root = directory()
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if hasattr(os, "getuid") and root.stat().st_uid != os.getuid():
            _report(f"{root} belongs to another user; not using it (set PORTKIT_CACHE)")
            return False
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        return True
    except OSError:
        return False


def _entry(key: bytes, binary: bytes) -> bytes:
    return MAGIC + key + hashlib.sha256(binary).digest() + binary


def _read_entry(path: Path, key: bytes) -> bytes | None:
    """The binary stored at `path` under `key`; None if absent; a bad entry is deleted."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(MAGIC) + 64
    binary = data[head:]
    if (data[:len(MAGIC)] == MAGIC and data[len(MAGIC):len(MAGIC) + 32] == key
            and data[len(MAGIC) + 32:head] == hashlib.sha256(binary).digest()):
        with contextlib.suppress(OSError):
            os.utime(path)   # most recently used: the size cap removes the oldest first
        return binary
    _report(f"entry {path} was empty, truncated, corrupt or another kernel's; deleted and "
            "rebuilt")
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def _location(backend: str, compiler: Compiler, source: str) -> tuple[Path, bytes]:
    identity = f"{backend}\0{compiler.cache_key}\0{source}"
    key = hashlib.sha256(identity.encode()).digest()
    return directory() / safe_name(backend) / f"{key.hex()}.bin", key


def compile_cached(backend: str, compiler: Compiler, source: str) -> bytes:
    """compiler.compile(source), read from the disk cache when the same build was done before."""
    if not compiler.cache_key:   # a compiler that cannot say what it builds for is not cached
        return compiler.compile(source)
    path, key = _location(backend, compiler, source)
    binary = _read_entry(path, key)
    if binary is None:
        binary = compiler.compile(source)
        if _usable(path.parent):
            write_atomic(path, _entry(key, binary))
    return binary


def compile_batch_cached(backend: str, compiler: Compiler, sources: list[str]
                         ) -> list[bytes | CompileError]:
    """`compiler.compile_batch` of the sources the disk cache lacks, the rest read from it:
    one result per source (its binary or its CompileError), each binary cached on its own.
    Raises the CompileError of a batch that failed as a whole."""
    results: list[bytes | CompileError | None] = [None] * len(sources)
    places = [_location(backend, compiler, s) if compiler.cache_key else None for s in sources]
    for i, place in enumerate(places):
        if place is not None:
            results[i] = _read_entry(*place)
    missing = [i for i, found in enumerate(results) if found is None]
    if missing:
        built = compiler.compile_batch([sources[i] for i in missing])
        for i, binary in zip(missing, built):
            results[i] = binary
            if isinstance(binary, bytes) and places[i] is not None and _usable(
                    places[i][0].parent):
                write_atomic(places[i][0], _entry(places[i][1], binary))
    return results


def tuned(device: str, key: str) -> dict | None:
    """The tuner's choice for kernel structure `key` on `device` (a device name), or None."""
    name = f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    try:
        entry = json.loads((directory() / "tune" / safe_name(device) / name).read_text())
    except (OSError, ValueError):
        return None
    return entry.get("choice") if isinstance(entry, dict) and entry.get("key") == key else None


def keep_tuned(device: str, key: str, choice: dict) -> None:
    """Stores the tuner's `choice` for kernel structure `key` on `device`."""
    folder = directory() / "tune" / safe_name(device)
    if _usable(folder):
        write_atomic(folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json",
                     json.dumps({"key": key, "choice": choice}).encode())


@contextlib.contextmanager
def file_holding(backend: str, binary: bytes, suffix: str) -> Iterator[Path]:
    """A file whose bytes are exactly `binary` (for a loader that needs a path): the cached
    copy named by their hash, checked before use, else a temporary file removed afterwards."""
    digest = hashlib.sha256(binary).hexdigest()
    folder = directory() / safe_name(backend) / "lib"
    path = folder / f"{digest}{suffix}"
    try:
        good = hashlib.sha256(path.read_bytes()).hexdigest() == digest
    except OSError:
        good = None
    if good is False:
        _report(f"file {path} did not hold the bytes its name says; rewritten")
    if good or (_usable(folder) and write_atomic(path, binary)):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="portkit-") as scratch:
        temporary = Path(scratch) / path.name
        temporary.write_bytes(binary)
        yield temporary


def write_atomic(path: Path, data: bytes) -> bool:
    """Writes `data` to `path` through a rename; False (and no file) if the disk refuses."""
    global _writes
    tmp = None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as file:
            tmp = file.name
            file.write(data)
        os.replace(tmp, path)
    except OSError:   # a read-only or full disk only costs a recompile
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
    _writes += 1
    if _writes % _WRITES_BETWEEN_CAPS == 1:
        shrink(max_bytes())
    return True


def _files() -> list[tuple[Path, os.stat_result]]:
    found = []
    for folder, _, names in os.walk(directory()):
        for name in names:
            path = Path(folder) / name
            with contextlib.suppress(OSError):
                found.append((path, path.stat()))
    return found


def shrink(limit: int) -> int:
    """Removes the least recently used entries until the cache holds at most `limit` bytes
    (three quarters of it, so that the next writes do not walk the folder again at once);
    returns the bytes removed."""
    files = _files()
    total = sum(st.st_size for _, st in files)
    if total <= limit:
        return 0
    removed = 0
    for path, st in sorted(files, key=lambda f: f[1].st_mtime):
        if total - removed <= limit * 3 // 4:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            removed += st.st_size
    return removed


def info() -> dict:
    """The cache's folder, cap, and per backend folder its entries and bytes."""
    backends: dict[str, dict[str, int]] = {}
    root = directory()
    for path, st in _files():
        name = path.relative_to(root).parts[0]
        entry = backends.setdefault(name, {"entries": 0, "bytes": 0})
        entry["entries"] += 1
        entry["bytes"] += st.st_size
    return {"directory": str(root), "max_bytes": max_bytes(), "backends": backends,
            "bytes": sum(b["bytes"] for b in backends.values())}


def clear() -> int:
    """Deletes every entry; returns the bytes freed."""
    freed = sum(st.st_size for _, st in _files())
    shutil.rmtree(directory(), ignore_errors=True)
    return freed
