"""Matmul on a device with workgroup memory: the LOCAL-tiled kernel (codegen/tiles.py, default
tiling or the tuner's), the untiled one, and the CPU backend's, interleaved in one run so that a
shared machine's load hits all three alike: median [slowest-fastest] GFLOP/s of the kernels
alone (inputs on the device, launch waited for), and each device figure as a ratio to the CPU's.

    PYTHONPATH=. python benchmarks/local_tiling.py --device opencl --size 512 1024
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from portkit import runtime, schedule
from portkit.codegen import tiles, tune
from portkit.codegen.lower import lower
from portkit.tensor import Tensor


def _launcher(rt, kernel, a: np.ndarray, b: np.ndarray, item, left):
    """A callable running `kernel` once on `rt` over a and b (`left`: a's Lazy), after checking
    its result."""
    compiled = rt.compile(kernel)
    arrays = [np.zeros(a.shape[0] * b.shape[1], np.float32)] + [
        (a if node is left else b).reshape(-1) for node in item.inputs]
    buffers = [rt.alloc(p.dtype, x.size).copyin(x) for p, x in zip(compiled.kernel.params, arrays)]
    rt.launch(compiled, buffers, wait=True)
    np.testing.assert_allclose(buffers[0].numpy().reshape(a.shape[0], -1), a @ b,
                               rtol=1e-3, atol=1e-3 * a.shape[1])
    return lambda: rt.launch(compiled, buffers, wait=True)


def measure(device: str, size: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per round of each kernel: 'cpu', 'tiled' (the device's default or tuned tiling)
    and 'untiled'."""
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (size, size)).astype(np.float32) for _ in range(2))
    runs = {}
    cpu = runtime.get("cpu")
    x, y = Tensor(a, device="cpu"), Tensor(b, device="cpu")
    item, = schedule.create_schedule([(x @ y).lazy])
    runs["cpu"] = _launcher(cpu, lower(item.root, item.inputs, cpu.capabilities), a, b, item, x.lazy)
    rt = runtime.get(device)
    x, y = Tensor(a, device=device), Tensor(b, device=device)
    item, = schedule.create_schedule([(x @ y).lazy])
    caps = rt.capabilities
    found = tune.contraction(item.root, item.inputs, caps)
    if found is not None:
        chosen = tiles.choose(found, caps, tune.stored(caps, found))
        if chosen is not None:
            runs["tiled"] = _launcher(rt, lower(item.root, item.inputs, caps, local=chosen),
                                      a, b, item, x.lazy)
    runs["untiled"] = _launcher(rt, lower(item.root, item.inputs, caps, local=tiles.UNTILED),
                                a, b, item, x.lazy)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="opencl")
    parser.add_argument("--size", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"{args.device}: {runtime.get(args.device).capabilities.device_name}")
    print("size | kernel | GFLOP/s median [slowest-fastest] | ratio to the CPU backend")
    for size in args.size:
        times = measure(args.device, size, args.rounds)
        cpu = statistics.median(times["cpu"])
        for name, seconds in times.items():
            work = 2 * size ** 3 / 1e9
            median = statistics.median(seconds)
            print(f"{size} | {name} | {work / median:.1f} [{work / max(seconds):.1f}-"
                  f"{work / min(seconds):.1f}] | {cpu / median:.2f}x", flush=True)


if __name__ == "__main__":
    main()
