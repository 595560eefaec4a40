"""portkit vs numpy (and PyTorch when installed) on the issue's workloads: medians and ratios.

    PYTHONPATH=. python benchmarks/bench.py [--size 16777216] [--repeat 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from portkit.tensor import Tensor

try:
    import torch
except ImportError:
    torch = None


def median_seconds(fn, repeat: int) -> float:
    fn()                        # warm up: compile, caches, page faults
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=1 << 24)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    n, r = args.size, args.repeat
    a_np, b_np, c_np = (np.random.rand(n).astype(np.float32) for _ in range(3))
    a, b, c = Tensor(a_np), Tensor(b_np), Tensor(c_np)
    m_np = np.random.rand(256, 256).astype(np.float32)
    m = Tensor(m_np)
    one_np = np.ones(4, np.float32)
    one = Tensor(one_np)
    cases = {
        # name: (bytes or flops, unit, portkit, numpy, torch)
        "fused 4-op chain (GB/s)": (16 * n, lambda: ((a * b + c).relu() * 2).realize(),
                                    lambda: np.maximum(a_np * b_np + c_np, 0) * 2, None),
        "sum (GB/s)": (4 * n, lambda: a.sum().realize(), lambda: a_np.sum(), None),
        "matmul 256 (GFLOP/s)": (2 * 256 ** 3, lambda: (m @ m).realize(),
                                 lambda: m_np @ m_np, None),
        "tiny add end to end (ops/s)": (1, lambda: (one + 1).numpy(), lambda: one_np + 1, None),
    }
    if torch is not None:
        ta, tb, tc, tm, tone = (torch.from_numpy(x) for x in (a_np, b_np, c_np, m_np, one_np))
        torch_fns = [lambda: ((ta * tb + tc).relu() * 2), lambda: ta.sum(), lambda: tm @ tm,
                     lambda: (tone + 1).numpy()]
        cases = {k: (v[0], v[1], v[2], f) for (k, v), f in zip(cases.items(), torch_fns)}
    print(f"{'workload':32} {'portkit':>10} {'numpy':>10} {'torch':>10} {'pk/numpy':>9}")
    for name, (work, ours, numpy_fn, torch_fn) in cases.items():
        rates = [work / median_seconds(fn, r) / (1e9 if "GB" in name or "GFLOP" in name else 1)
                 if fn else float("nan") for fn in (ours, numpy_fn, torch_fn)]
        print(f"{name:32} {rates[0]:10.2f} {rates[1]:10.2f} {rates[2]:10.2f} "
              f"{rates[0] / rates[1]:9.2f}")


if __name__ == "__main__":
    main()
