"""A data-parallel SGD step on two devices of one process against one device on the whole batch,
and the share of the step that is the gradients' all-reduce.

    PYTHONPATH=. python benchmarks/data_parallel.py [--batch 64] [--repeat 5]

An MLP (256-256-256-10, batch `--batch`) on `cpu` and `cpu:1` (`distributed.DataParallel`, the
cpu backend's logical devices: they share the cores, so two devices do not run faster, and the
rows say what the replicas and the all-reduce cost) against `cpu` alone, and the same
two-device step captured by `portkit.jit` (its copies between devices included). The
all-reduce row times `all_reduce_gradients` on gradients already realized; with torch
installed, a last row times `ProcessGroupReducer.all_reduce_gradients` on a gloo group of one
rank: the host crossing (numpy, one bucket, torch) without a second process. Medians of
`--repeat` runs (bench.timings), and for the three steps also the median CPU time of this
process over 15 rounds that run each step once in turn (steadier than wall time on a machine
shared with other work).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
from bench import timings

import portkit
from portkit import distributed, nn, optim, runtime
from portkit.tensor import Tensor, realize

DEVICES = ["cpu", "cpu:1"]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def mse(output: Tensor, target: Tensor) -> Tensor:
    return ((output - target) ** 2).mean()


def synchronize() -> None:
    for device in DEVICES:
        runtime.get(device).synchronize()


def cpu_times(fns: list[Callable[[], None]], rounds: int) -> list[float]:
    """The median CPU seconds of this process per call of each of `fns`, over `rounds` rounds
    that call each once in turn."""
    spent: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, spent):
            start = time.process_time()
            fn()
            times.append(time.process_time() - start)
    return [float(np.median(times)) for times in spent]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 256)).astype(np.float32)
    y = rng.standard_normal((args.batch, 10)).astype(np.float32)

    single = mlp()
    opt = optim.SGD(single.parameters(), lr=0.01)

    def one_device() -> None:
        opt.zero_grad()
        mse(single(Tensor(x)), Tensor(y)).backward()
        opt.step()
        realize(*single.parameters())
        synchronize()

    parallel = distributed.DataParallel(mlp(), DEVICES, lambda p: optim.SGD(p, lr=0.01))

    def losses() -> list[Tensor]:
        return [mse(r(xs), ys) for r, xs, ys in zip(
            parallel.replicas, parallel.scatter(Tensor(x)), parallel.scatter(Tensor(y)))]

    def two_devices() -> None:
        parallel.zero_grad()
        parallel.backward(losses())
        parallel.step()
        realize(*[p for r in parallel.replicas for p in r.parameters()])
        synchronize()

    jitted_parallel = distributed.DataParallel(mlp(), DEVICES, lambda p: optim.SGD(p, lr=0.01))

    @portkit.jit
    def jitted_step(xt: Tensor, yt: Tensor) -> None:
        jitted_parallel.zero_grad()
        jitted_parallel.backward([mse(r(xs), ys) for r, xs, ys in zip(
            jitted_parallel.replicas, jitted_parallel.scatter(xt), jitted_parallel.scatter(yt))])
        jitted_parallel.step()

    def two_devices_jit() -> None:
        jitted_step(Tensor(x), Tensor(y))
        realize(*[p for r in jitted_parallel.replicas for p in r.parameters()])
        synchronize()

    def all_reduce_only() -> None:
        parallel.all_reduce_gradients()
        synchronize()

    two_devices_jit()       # the two calls that capture, before the timed ones
    two_devices_jit()
    rows = [one_device, two_devices, two_devices_jit]
    one, two, jit = (np.median(timings(fn, args.repeat)) for fn in rows)
    cpu_one, cpu_two, cpu_jit = cpu_times(rows, 15)
    parallel.zero_grad()
    for loss in losses():
        loss.backward()
    realize(*[p.grad for r in parallel.replicas for p in r.parameters()])
    reduce = np.median(timings(all_reduce_only, args.repeat))
    print(f"MLP 256-256-256-10, batch {args.batch}, SGD step; load {os.getloadavg()[0]:.1f}")
    print(f"{'':40s} {'wall':>8s}    {'CPU':>8s}")
    print(f"{'one device, whole batch':40s} {one * 1e3:8.2f} ms {cpu_one * 1e3:8.2f} ms")
    print(f"{'two devices (cpu, cpu:1), a share each':40s} {two * 1e3:8.2f} ms "
          f"{cpu_two * 1e3:8.2f} ms")
    print(f"{'the same under portkit.jit':40s} {jit * 1e3:8.2f} ms {cpu_jit * 1e3:8.2f} ms")
    print(f"{'  of which the all-reduce':40s} {reduce * 1e3:8.2f} ms  ({reduce / two:.0%})")
    try:
        import torch.distributed as dist
    except ImportError:
        return
    with tempfile.TemporaryDirectory() as store:     # the file store removes its file itself
        dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=0,
                                world_size=1)
        reducer = distributed.ProcessGroupReducer(parallel.replicas[0])
        crossing = np.median(timings(reducer.all_reduce_gradients, args.repeat))
        dist.destroy_process_group()
    print(f"{'process group (gloo, 1 rank), one model':40s} {crossing * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
