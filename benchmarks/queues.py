"""Replays in one batch (ABI 0.7, `Device.batch`) against launches one by one, in one process.

    PORTKIT_DEVICE=cpu PYTHONPATH=. python benchmarks/queues.py [--repeat 5] [--calls 200]

Two jitted workloads: a chain of 50 tiny kernels (x * 1.0001 + 0.5 on 16 floats, each realized)
and an MLP SGD step (784-512-512-10, batch 64, as benchmarks/bench.py's). Each is timed with
its replays batched and with `Queue.take` refusing every batch (the launches one by one, the
replay engine's other path), the two in turns, `--repeat` times; medians of wall and CPU time
per call (and per kernel for the chain), each run ending with the device's synchronize.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

import portkit
from portkit import nn, optim, runtime
from portkit.schedule import replay
from portkit.tensor import Tensor

CHAIN = 50


def _chain(device: str) -> tuple[Callable, int]:
    @portkit.jit
    def chain(x: Tensor) -> Tensor:
        for _ in range(CHAIN):
            x = (x * 1.0001 + 0.5).realize()
        return x
    x = Tensor(np.linspace(-1, 1, 16, dtype=np.float32), device=device)
    return lambda: chain(x), CHAIN


def _mlp(device: str) -> tuple[Callable, int]:
    rng = np.random.default_rng(0)
    layers = [nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)]   # PORTKIT_DEVICE
    opt = optim.SGD([p for layer in layers for p in layer.parameters()], lr=0.01)
    x = Tensor(rng.standard_normal((64, 784), dtype=np.float32), device=device)
    y = Tensor(np.arange(64, dtype=np.int32) % 10, device=device)

    @portkit.jit
    def train(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        h = layers[1](layers[0](x).relu()).relu()
        loss = layers[2](h).cross_entropy(y)
        loss.backward()
        opt.step()
        return loss
    step = lambda: train(x, y)
    for _ in range(train.CAPTURES + 1):
        step().numpy()
    return step, len(train.plan.steps)


def _time(run: Callable, calls: int, device: str) -> tuple[float, float]:
    """Wall and CPU seconds per call over `calls` calls, then a synchronize."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        run()
    runtime.get(device).synchronize()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=os.environ.get("PORTKIT_DEVICE", "cpu"),
                        help="the MLP's parameters are on PORTKIT_DEVICE: leave it so")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    batched = replay.Queue.take

    def one_by_one(self, steps) -> bool:    # the replay engine's path without a batch
        return False

    for name, make in (("chain of 50 tiny kernels", _chain), ("MLP SGD step", _mlp)):
        if args.only and args.only not in name:
            continue
        run, kernels = make(args.device)
        for _ in range(3):
            run()
        calls = max(3, args.calls // (1 if make is _chain else 20))
        results: dict[str, list[tuple[float, float]]] = {"batched": [], "one by one": []}
        for _ in range(args.repeat):
            for mode, take in (("batched", batched), ("one by one", one_by_one)):
                replay.Queue.take = take
                results[mode].append(_time(run, calls, args.device))
        replay.Queue.take = batched
        print(f"{args.device}: {name} ({kernels} kernels a call, {calls} calls x "
              f"{args.repeat})")
        medians = {}
        for mode, found in results.items():
            wall = statistics.median(w for w, _ in found)
            cpu = statistics.median(c for _, c in found)
            medians[mode] = wall
            print(f"  {mode:<11} {wall * 1e6:10.1f} us/call  {wall * 1e6 / kernels:8.2f} us/kernel"
                  f"  (CPU {cpu * 1e6 / kernels:8.2f} us/kernel)")
        print(f"  one by one / batched: {medians['one by one'] / medians['batched']:.2f}x")


if __name__ == "__main__":
    main()
