"""Matmul on the CPU backend's matrix units: portkit float32, portkit bfloat16 (vdpbf16ps where the
CPU has AVX-512 BF16, else float32 sums per element) and torch bfloat16; portkit uint8 @ int8
summed in int32 (vpdpbusd where the CPU has AVX-512 VNNI) and torch's int8 @ int8
(`torch._int_mm`), in one process: median [slowest-fastest] GFLOP/s (GOP/s for the integers) of
`--repeat` runs after one warm-up, and the ratios of the medians.

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
    ua = rng.integers(0, 256, (size, size)).astype(np.uint8)
    sb = rng.integers(-128, 128, (size, size)).astype(np.int8)
    pua, psb = Tensor(ua, device="cpu").realize(), Tensor(sb, device="cpu").realize()
    tsa, tsb = torch.from_numpy((ua // 2).astype(np.int8)), torch.from_numpy(sb)
    units = ", ".join(u.name for u in runtime.get("cpu").capabilities.matrix_units) or "none"
    rows = [("portkit float32", lambda: ((pa @ pb).realize(), sync())),
            ("portkit bfloat16", lambda: ((ha @ hb).realize(), sync())),
            ("torch bfloat16", lambda: ta @ tb),
            ("portkit uint8 @ int8", lambda: ((pua @ psb).realize(), sync())),
            ("torch int8 @ int8", lambda: torch._int_mm(tsa, tsb))]
    assert (ha @ hb).dtype == dtypes.bfloat16 and (pua @ psb).dtype == dtypes.int32
    work = 2 * size ** 3
    print(f"matmul {size}, {threads()} thread(s), matrix units: {units}")
    medians = {}
    for name, fn in rows:
        time.sleep(SETTLE)
        times = timings(fn, args.repeat)
        medians[name] = work / float(np.median(times)) / 1e9
        rate = "GOP/s" if "int8" in name else "GFLOP/s"
        print(f"{name}: {medians[name]:.1f} [{work / max(times) / 1e9:.1f}-"
              f"{work / min(times) / 1e9:.1f}] {rate}", flush=True)
    ours = medians["portkit bfloat16"]
    print(f"portkit bfloat16 / portkit float32: {ours / medians['portkit float32']:.2f}x; "
          f"/ torch bfloat16: {ours / medians['torch bfloat16']:.2f}x")
    ours = medians["portkit uint8 @ int8"]
    print(f"portkit uint8 @ int8 / portkit float32: {ours / medians['portkit float32']:.2f}x; "
          f"/ torch int8 @ int8: {ours / medians['torch int8 @ int8']:.2f}x")


if __name__ == "__main__":
    main()
