"""Sum 16M, matmul 512/1024/2048, the MLP's forward (x @ W.T) and backward matmuls, conv2d forward
and backward, and a padded copy on the CPU backend, beside numpy and torch in one run: median
[slowest-fastest] of `--repeat` runs after one warm-up.

    PYTHONPATH=. env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/contractions.py

With OMP_NUM_THREADS=1 every library runs on one thread (steadier on a shared machine).
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from bench import timings

from portkit import runtime
from portkit.tensor import Tensor


def spread(fn, repeat: int) -> tuple[float, float, float]:
    """(median, fastest, slowest) seconds of `repeat` runs of fn after one warm-up."""
    times = timings(fn, repeat)
    return float(np.median(times)), min(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--only", action="append", metavar="WORDS",
                        help="run only workloads whose name contains WORDS (repeatable)")
    args = parser.parse_args()
    if os.environ.get("OMP_NUM_THREADS") == "1":
        torch.set_num_threads(1)
    sync = runtime.get("cpu").synchronize
    rng = np.random.default_rng(0)
    rows = []

    def add(name, work, ours, theirs_np, theirs_torch):
        if args.only and not any(words in name for words in args.only):
            return
        rows.append((name, work, lambda: (ours().realize(), sync()), theirs_np, theirs_torch))

    a = rng.random(1 << 24, np.float32)
    pa, ta = Tensor(a).realize(), torch.from_numpy(a)
    add("sum 16M, GB/s", 4 << 24, pa.sum, a.sum, ta.sum)
    for size in (512, 1024, 2048):
        m, m2 = rng.random((size, size), np.float32), rng.random((size, size), np.float32)
        pm, pm2, tm, tm2 = Tensor(m).realize(), Tensor(m2).realize(), torch.from_numpy(m), \
            torch.from_numpy(m2)
        add(f"matmul {size}, GFLOP/s", 2 * size ** 3, lambda pm=pm, pm2=pm2: pm @ pm2,
            lambda m=m, m2=m2: m @ m2, lambda tm=tm, tm2=tm2: tm @ tm2)
    for batch, k, n in ((64, 784, 512), (64, 512, 512)):
        x, w = rng.random((batch, k), np.float32), rng.random((n, k), np.float32)
        px, pw, tx, tw = Tensor(x).realize(), Tensor(w).realize(), torch.from_numpy(x), \
            torch.from_numpy(w)
        add(f"x @ W.T {batch}x{k}x{n}, GFLOP/s", 2 * batch * k * n,
            lambda px=px, pw=pw: px @ pw.T, lambda x=x, w=w: x @ w.T,
            lambda tx=tx, tw=tw: tx @ tw.T)
    # the MLP's backward matmuls: dy @ W (input gradient) and dy.T @ x (weight gradient), whose
    # reduce is the batch of 64
    dy, dw, dx = (rng.random(shape, np.float32) for shape in ((64, 512), (512, 784), (64, 784)))
    pdy, pdw, pdx = (Tensor(v).realize() for v in (dy, dw, dx))
    tdy, tdw, tdx = (torch.from_numpy(v) for v in (dy, dw, dx))
    add("dy @ W 64x512x784, GFLOP/s", 2 * 64 * 512 * 784, lambda: pdy @ pdw, lambda: dy @ dw,
        lambda: tdy @ tdw)
    add("dy.T @ x 512x64x784, GFLOP/s", 2 * 64 * 512 * 784, lambda: pdy.T @ pdx,
        lambda: dy.T @ dx, lambda: tdy.T @ tdx)
    x, w = rng.random((8, 64, 56, 56), np.float32), rng.random((64, 64, 3, 3), np.float32)
    px, pw = Tensor(x).realize(), Tensor(w).realize()
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    conv = torch.nn.functional.conv2d
    add("conv2d 8x64x56x56 3x3, GFLOP/s", 2 * 8 * 64 * 56 * 56 * 64 * 9,
        lambda: px.conv2d(pw, padding=1), None, lambda: conv(tx, tw, padding=1))
    gx, gw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    tgx, tgw = tx.clone().requires_grad_(), tw.clone().requires_grad_()

    def backward():              # both gradients: twice the forward's work
        gx.grad = gw.grad = None
        gx.conv2d(gw, padding=1).sum().backward()
        gw.grad.realize()
        return gx.grad

    def torch_backward():
        tgx.grad = tgw.grad = None
        conv(tgx, tgw, padding=1).sum().backward()

    add("conv2d backward (both gradients), GFLOP/s", 4 * 8 * 64 * 56 * 56 * 64 * 9, backward,
        None, torch_backward)
    pad = ((0, 0), (0, 0), (1, 1), (1, 1))
    add("padded copy 8x64x56x56, GB/s", 4 * (x.size + 8 * 64 * 58 * 58),
        lambda: px.pad(pad), lambda: np.pad(x, pad), lambda: torch.nn.functional.pad(tx, (1,) * 4))
    print("workload | portkit | numpy | torch   (median [slowest-fastest])")
    for name, work, *fns in rows:
        cells = []
        for fn in fns:
            if fn is None:
                cells.append("-")
                continue
            median, fastest, slowest = spread(fn, args.repeat)
            cells.append(f"{work / median / 1e9:.1f} [{work / slowest / 1e9:.1f}-"
                         f"{work / fastest / 1e9:.1f}]")
        print(f"{name} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
