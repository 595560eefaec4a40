"""Matmul on the CPU backend's matrix unit: portkit float32, portkit bfloat16 (vdpbf16ps where the
CPU has AVX-512 BF16, else float32 sums per element) and torch bfloat16, in one process: median
[slowest-fastest] GFLOP/s of `--repeat` runs after one warm-up, and the ratios of the medians.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/matrix_units.py     (then =2)

OMP_NUM_THREADS sets the threads of both portkit (reference_backends/cpu/runtime.threads) and
torch; unset, both use every CPU this process may run on.
"""
from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np
import torch
from bench import SETTLE, timings

from portkit import dtypes, runtime
from portkit.reference_backends.cpu.runtime import threads
from portkit.tensor import Tensor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(threads())
    size, sync = args.size, runtime.get("cpu").synchronize
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((size, size), np.float32) for _ in range(2))
    pa, pb = Tensor(a, device="cpu").realize(), Tensor(b, device="cpu").realize()
    ha, hb = (Tensor(x.astype(ml_dtypes.bfloat16), device="cpu").realize() for x in (a, b))
    ta, tb = (torch.from_numpy(x).to(torch.bfloat16) for x in (a, b))
    units = ", ".join(u.name for u in runtime.get("cpu").capabilities.matrix_units) or "none"
    rows = [("portkit float32", lambda: ((pa @ pb).realize(), sync())),
            ("portkit bfloat16", lambda: ((ha @ hb).realize(), sync())),
            ("torch bfloat16", lambda: ta @ tb)]
    assert (ha @ hb).dtype == dtypes.bfloat16
    work = 2 * size ** 3
    print(f"matmul {size}, {threads()} thread(s), matrix units: {units}")
    medians = {}
    for name, fn in rows:
        time.sleep(SETTLE)
        times = timings(fn, args.repeat)
        medians[name] = work / float(np.median(times)) / 1e9
        print(f"{name}: {medians[name]:.1f} [{work / max(times) / 1e9:.1f}-"
              f"{work / min(times) / 1e9:.1f}] GFLOP/s", flush=True)
    ours = medians["portkit bfloat16"]
    print(f"portkit bfloat16 / portkit float32: {ours / medians['portkit float32']:.2f}x; "
          f"/ torch bfloat16: {ours / medians['torch bfloat16']:.2f}x")


if __name__ == "__main__":
    main()
