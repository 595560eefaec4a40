"""portkit.cache: the disk cache verifies and repairs itself, stays inside its folder and under
its cap, and `portkit cache info|clear` show and empty it (issues 11, 6 and 17)."""
from __future__ import annotations

import hashlib
import os
import tempfile
import warnings

import numpy as np
import pytest

from portkit import cache, cli, runtime
from portkit.abi.backend import Compiler
from portkit.runtime import Runtime
from tests.test_runtime import axpy


@pytest.fixture(autouse=True)
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_reported", set())
    return tmp_path / "cache"


class Counting(Compiler):
    cache_key = "counting 1.0"

    def __init__(self):
        self.calls = 0

    def compile(self, source: str) -> bytes:
        self.calls += 1
        return ("binary of " + source).encode()


@pytest.mark.parametrize("damage", ["truncate", "flip", "other kernel", "empty", "random",
                                    "magic"])
def test_a_bad_entry_is_deleted_rebuilt_and_reported_once(cache_dir, damage):
    compiler = Counting()
    assert cache.compile_cached("b", compiler, "one") == b"binary of one"
    assert cache.compile_cached("b", compiler, "two") == b"binary of two"
    one = _entry_for(cache_dir, compiler, "one")
    data = one.read_bytes()
    if damage == "truncate":
        one.write_bytes(data[:len(data) // 2])
    elif damage == "flip":
        one.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "empty":
        one.write_bytes(b"")
    elif damage == "random":
        one.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif damage == "magic":
        one.write_bytes(b"X" + data[1:])
    else:   # a valid entry of another kernel planted under this one's name
        one.write_bytes(_entry_for(cache_dir, compiler, "two").read_bytes())
    with pytest.warns(cache.CacheWarning, match="deleted and rebuilt"):
        assert cache.compile_cached("b", compiler, "one") == b"binary of one"
    assert compiler.calls == 3
    one.write_bytes(cache.MAGIC + b"garbage")
    with warnings.catch_warnings():
        warnings.simplefilter("error")    # reported once per entry, not on every run
        assert cache.compile_cached("b", compiler, "one") == b"binary of one"
    assert cache.compile_cached("b", compiler, "one") == b"binary of one"
    assert compiler.calls == 4       # the rebuilt entry is good again


def _entry_for(cache_dir, compiler, source):
    key = hashlib.sha256(f"b\0{compiler.cache_key}\0{source}".encode()).hexdigest()
    return cache_dir / "b" / f"{key}.bin"


def test_a_backend_name_cannot_leave_the_cache(cache_dir, tmp_path):
    cache.compile_cached("../../escape", Counting(), "x")
    assert not (tmp_path / "escape").exists() and not (cache_dir.parent.parent / "escape").exists()
    (folder,) = cache_dir.iterdir()
    assert folder.parent == cache_dir and ".." not in folder.name
    assert cache.safe_name("a/b") != cache.safe_name("a_b")


def test_folders_are_private(cache_dir):
    cache.compile_cached("b", Counting(), "x")
    assert (cache_dir.stat().st_mode & 0o777) == 0o700
    assert ((cache_dir / "b").stat().st_mode & 0o777) == 0o700


def test_the_cpu_key_holds_the_whole_compiler_command(monkeypatch):
    from portkit.reference_backends.cpu.runtime import CPUCompiler, find_compiler
    command = find_compiler()
    plain = CPUCompiler(command)
    sanitized = CPUCompiler([*command, "-fsanitize=address"])
    assert plain.cache_key != sanitized.cache_key


def test_a_planted_shared_object_is_not_loaded(cache_dir):
    # The library's file name is the hash of its bytes; a file there with other bytes (a
    # planted library whose constructor would run) is replaced before dlopen.
    rt = Runtime("cpu", runtime.get("cpu").device)
    kernel = axpy(5.0, "planted")
    rt.build(kernel)
    (library,) = (cache_dir / "cpu" / "lib").glob("*.so")
    good = library.read_bytes()
    planted = library.with_suffix(".planted")
    planted.write_bytes(b"\x7fELF not really")
    os.replace(planted, library)    # not written in place: the loaded library maps that file
    with pytest.warns(cache.CacheWarning, match="did not hold"):
        again = Runtime("cpu", runtime.get("cpu").device).build(kernel)
    assert library.read_bytes() == good
    out = again.program and Runtime("cpu", runtime.get("cpu").device).run(
        kernel, np.ones(16, np.float32), np.zeros(16, np.float32), scalars=(16,))[1]
    np.testing.assert_array_equal(out, np.full(16, 5.0, np.float32))


def test_an_unwritable_cache_leaves_no_temporary_files(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTKIT_CACHE", "/proc/no-such-cache")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    before = set(tmp_path.iterdir())
    Runtime("cpu", runtime.get("cpu").device).run(
        axpy(9.0, "temporary"), np.ones(16, np.float32), np.zeros(16, np.float32), scalars=(16,))
    assert set(tmp_path.iterdir()) == before


def test_the_default_folder_honours_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("PORTKIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.directory() == tmp_path / "xdg" / "portkit"


def test_the_cap_removes_the_least_recently_used(cache_dir):
    compiler = Counting()
    for k in range(6):
        cache.compile_cached("b", compiler, f"kernel {k}" + "x" * 1000)
    files = sorted(cache_dir.rglob("*.bin"), key=lambda p: p.stat().st_mtime)
    for age, path in enumerate(files):
        os.utime(path, (1000 + age, 1000 + age))
    size = files[0].stat().st_size
    removed = cache.shrink(3 * size)
    left = set(cache_dir.rglob("*.bin"))
    assert removed >= 3 * size and files[-1] in left and files[0] not in left


def test_cache_info_and_clear(cache_dir, capsys):
    cache.compile_cached("b", Counting(), "x")
    about = cache.info()
    assert about["backends"]["b"]["entries"] == 1 and about["bytes"] > 0
    assert cli.main(["cache", "info"]) == 0 and str(cache_dir) in capsys.readouterr().out
    assert cli.main(["cache", "clear"]) == 0 and "removed" in capsys.readouterr().out
    assert cache.info()["bytes"] == 0


def test_cpu_probe_compiles_once_per_cache(monkeypatch):
    """The cpu backend's probe (its runtime library) is a build like any other: a second
    process (here, a second find_device) reads it from the disk cache instead of running the
    compiler again."""
    from portkit.reference_backends.cpu import device
    from portkit.reference_backends.cpu import runtime as cpu_runtime

    calls = []
    compile_for_real = cpu_runtime.CPUCompiler.compile

    def counting(self, source):
        calls.append(source)
        return compile_for_real(self, source)

    monkeypatch.setattr(cpu_runtime.CPUCompiler, "compile", counting)
    first = device.find_device()
    second = device.find_device()
    assert len(calls) == 1
    assert first.cache_key == second.cache_key
