"""Bounded memory: the buffer pool keeps at most its byte cap, compiled and lowered kernels are
kept for the most recent shapes only, and runtime.clear() frees it all (issue 11, item 7)."""
from __future__ import annotations

import numpy as np

import portkit
from portkit import Tensor, runtime
from portkit.abi import dtypes
from portkit.abi.backend import HostAllocator
from portkit.schedule import runner


class _Counting(HostAllocator):
    def __init__(self):
        self.live = 0

    def alloc(self, nbytes):
        self.live += nbytes
        return super().alloc(nbytes)

    def free(self, buffer, nbytes):
        self.live -= nbytes


def test_the_pool_holds_at_most_its_byte_cap():
    allocator = _Counting()
    pool = runtime.BufferPool(allocator, max_bytes=10 * 4096)
    for size in range(100):       # 100 freed buffers of distinct sizes, about 4 KiB each
        runtime.Buffer(pool, dtypes.uint8, 4096 + size)
    assert pool.bytes <= 10 * 4096 and allocator.live == pool.bytes
    newest = runtime.Buffer(pool, dtypes.uint8, 4096 + 99)   # the most recent size stays
    assert pool.bytes < 10 * 4096 and newest.handle.size == 4096 + 99
    pool.clear()
    assert pool.bytes == 0 and allocator.live == newest.nbytes


def test_a_size_whose_own_handles_are_evicted_stays_in_the_pool():
    # Two 70-byte buffers under a 100-byte cap: keeping the second evicts the first, the
    # size's only other handle. The pool used to drop the size's emptied list along with it,
    # keep counting the second handle's bytes with nothing left to evict, and raise
    # StopIteration at the next buffer freed (printed from Buffer.__del__ on an H200).
    allocator = _Counting()
    pool = runtime.BufferPool(allocator, max_bytes=100)
    first, second = (runtime.Buffer(pool, dtypes.uint8, 70) for _ in range(2))
    del first, second
    assert pool.bytes == allocator.live == 70
    third, fourth = (runtime.Buffer(pool, dtypes.uint8, 70) for _ in range(2))
    pool.give(third.handle, 70)
    third.owned = False
    assert pool.bytes == allocator.live - 70 == 70    # fourth is live
    del fourth
    assert pool.bytes == 70 and allocator.live == 70


def test_a_buffer_larger_than_the_cap_is_freed_at_once():
    allocator = _Counting()
    pool = runtime.BufferPool(allocator, max_bytes=100)
    runtime.Buffer(pool, dtypes.uint8, 1000)
    assert pool.bytes == 0 and allocator.live == 0


def test_the_lru_keeps_the_most_recently_used():
    cache = runtime.LRU(2)
    cache["a"], cache["b"] = 1, 2
    assert cache.get("a") == 1      # "a" is now the most recent
    cache["c"] = 3
    assert list(cache) == ["a", "c"] and cache.get("b") is None


def test_an_lru_look_up_hashes_and_compares_its_key_once():
    class Key(tuple):
        hashes = compares = 0

        def __hash__(self):
            Key.hashes += 1
            return tuple.__hash__(self)

        def __eq__(self, other):
            Key.compares += 1
            return tuple.__eq__(self, other)

    cache = runtime.LRU(4)
    cache[Key((1, 2))] = "a"
    Key.hashes = Key.compares = 0
    assert cache.get(Key((1, 2))) == "a" and cache.setdefault(Key((1, 2)), "b") == "a"
    assert (Key.hashes, Key.compares) == (2, 2)     # one each per look-up


def test_an_lru_never_answers_for_another_key_of_the_same_hash():
    class Colliding(tuple):
        def __hash__(self):
            return 7

    cache = runtime.LRU(4)
    cache[Colliding((1,))] = "one"
    assert cache.get(Colliding((2,))) is None       # same hash, other key: a miss
    cache[Colliding((2,))] = "two"                   # keeps the later of the two
    assert cache.get(Colliding((2,))) == "two" and cache.get(Colliding((1,))) is None
    assert cache.setdefault(Colliding((1,)), "uno") == "uno"


def test_many_shapes_keep_a_bounded_number_of_kernels(monkeypatch):
    monkeypatch.setattr(runner, "_kernels", runtime.LRU(8))
    monkeypatch.setattr(runner, "_replays", runtime.LRU(8))
    rt = runtime.get("cpu")
    monkeypatch.setattr(rt, "_compiled", runtime.LRU(8))
    for n in range(1, 30):
        np.testing.assert_array_equal((Tensor.ones(n, device="cpu") * 3).numpy(),
                                      np.full(n, 3, np.float32))
    assert len(runner._kernels) <= 8 and len(runner._replays) <= 8
    assert len(rt._compiled) <= 8


def test_clear_forgets_kernels_replays_jit_plans_and_pooled_buffers():
    (Tensor.ones(37, device="cpu") + 1).numpy()
    (Tensor.ones(37, device="cpu") + 1).numpy()     # a replay of the first
    jitted = portkit.jit(lambda x: x * 2)
    x = Tensor.ones(37, device="cpu").realize()
    while jitted.plan is None:
        jitted(x)
    rt = runtime.get("cpu")
    runtime.clear()
    assert len(runner._kernels) == len(runner._replays) == len(rt._compiled) == 0
    assert rt.pool.bytes == 0 and jitted.plan is None
    np.testing.assert_array_equal(jitted(x).numpy(), np.full(37, 2, np.float32))
    np.testing.assert_array_equal((Tensor.ones(37, device="cpu") + 1).numpy(),
                                  np.full(37, 2, np.float32))


def test_an_lru_entry_set_again_is_the_most_recent_and_holds_the_new_value():
    cache = runtime.LRU(2)
    cache["a"], cache["b"] = 1, 2
    cache["a"] = 3
    cache["c"] = 4
    assert list(cache) == ["a", "c"] and cache.get("a") == 3 and len(cache) == 2
    assert cache.setdefault("d", 5) == 5 and list(cache) == ["a", "d"]
