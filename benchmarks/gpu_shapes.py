"""The shapes real models run, one by one on a device beside torch on the same device: the zoo's
matmuls and convolutions at batch 1, float16/bfloat16 matmuls (the matrix-unit path), and each
zoo model's kernels by time. scripts/gpu-check.sh runs it on cuda.

    python benchmarks/gpu_shapes.py [--device cuda] [--sections matmul conv low zoo]
        [--models bert_base resnet18 gpt2_decode]

Each line: portkit's wall time per call (ms, median), its kernels' time (`PORTKIT_DEBUG=2`),
torch's time, the rate by kernel time, and each kernel's name, grid, block and ms.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from portkit import runtime
from portkit.tensor import Tensor

sys.path.insert(0, str(Path(__file__).parent))
from bench import median_seconds  # beside this file
from models import debug_launches

RNG = np.random.default_rng(0)


def median_ms(fn, wait, repeat: int = 20) -> float:
    """Median milliseconds of fn() and the wait for its device, as bench.py times a call."""
    return median_seconds(lambda: (fn(), wait()), repeat) * 1e3


def line(label: str, ours, theirs, flops: float, sync, tsync) -> None:
    wall, launches = median_ms(ours, sync), debug_launches(ours)
    kernel_ms = sum(k[3] for k in launches)
    print(f"{label}: {wall:.3f} | {kernel_ms:.3f} | {median_ms(theirs, tsync):.3f} | "
          f"{flops / kernel_ms / 1e6:,.0f} GFLOP/s  {launches}", flush=True)


def matmuls(device: str, where: str, sync, tsync) -> None:
    print("== matmul float32: portkit wall ms | kernel ms | torch ms | rate by kernel ms")
    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = [(128, 768, 3072), (128, 3072, 768), (128, 768, 768), (128, 768, 2304),
              (1, 768, 3072), (1, 3072, 768), (1, 768, 50257), (128, 768, 50257),
              (1024, 1024, 1024)]
    for m, k, n in shapes:
        a_np, b_np = (RNG.standard_normal(s, dtype=np.float32) for s in ((m, k), (k, n)))
        a, b = (Tensor(x, device=device).realize() for x in (a_np, b_np))
        ta, tb = (torch.from_numpy(x).to(where) for x in (a_np, b_np))
        line(f"{m}x{k}x{n}", lambda a=a, b=b: (a @ b).realize(), lambda ta=ta, tb=tb: ta @ tb,
             2 * m * k * n, sync, tsync)


def convs(device: str, where: str, sync, tsync) -> None:
    print("== conv2d 3x3 float32, batch 1, padding 1: the same columns")
    for c, size in [(512, 7), (256, 14), (128, 28), (64, 56)]:
        x_np = RNG.standard_normal((1, c, size, size), dtype=np.float32)
        w_np = RNG.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.05
        x, w = (Tensor(v, device=device).realize() for v in (x_np, w_np))
        tx, tw = (torch.from_numpy(v).to(where) for v in (x_np, w_np))
        line(f"{c}x{size}x{size}", lambda x=x, w=w: x.conv2d(w, padding=1).realize(),
             lambda tx=tx, tw=tw: torch.nn.functional.conv2d(tx, tw, padding=1),
             2 * c * c * 9 * size * size, sync, tsync)


def low_precision(device: str, where: str, sync, tsync) -> None:
    print("== float16/bfloat16 matmuls (float32 sums): the same columns, error against float64")
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        for size in (1024, 4096) if where == "cuda" else (256,):
            ta, tb = (torch.randn(size, size, device=where, dtype=dtype) for _ in range(2))
            a, b = (Tensor(t.float().cpu().numpy(), device=device).cast(name).realize()
                    for t in (ta, tb))
            line(f"{name} {size}", lambda a=a, b=b: (a @ b).realize(),
                 lambda ta=ta, tb=tb: ta @ tb, 2 * size ** 3, sync, tsync)
            got = (a @ b).cast("float32").numpy()
            exact = (ta.double() @ tb.double()).cpu().numpy()
            print(f"  relative error {np.linalg.norm(got - exact) / np.linalg.norm(exact):.1e}")


def zoo_kernels(device: str, models: list[str], sync) -> None:
    import onnxruntime
    import platformdirs
    import zoo

    import portkit.onnx
    print("== zoo models: call ms, then kernels by time (medians of 3 calls)")
    for name in models:
        _, inputs, path = zoo.exported(name, "full", 1,
                                       platformdirs.user_cache_path("portkit-zoo"))
        names = [i.name for i in onnxruntime.InferenceSession(
            str(path), providers=["CPUExecutionProvider"]).get_inputs()]
        feeds = {n: x.numpy() for n, x in zip(names, inputs)}
        model = portkit.onnx.load(path, device=device)
        def call(model=model, feeds=feeds):
            return model(**feeds)
        call()
        print(f"{name}: call {median_ms(call, sync, 7):.2f} ms")
        runs = [debug_launches(call) for _ in range(3)]
        shapes = {n: (g, b) for n, g, b, _ in runs[0]}
        counts = collections.Counter(n for n, *_ in runs[0])
        totals = collections.defaultdict(list)
        for launches in runs:
            per = collections.defaultdict(float)
            for n, _, _, ms in launches:
                per[n] += ms
            for n, ms in per.items():
                totals[n].append(ms)
        ranked = sorted(totals, key=lambda n: -statistics.median(totals[n]))
        for n in ranked[:15]:
            grid, block = shapes[n]
            print(f"  {statistics.median(totals[n]):7.3f} ms {counts[n]:3d}x {n} grid {grid} "
                  f"block {block}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sections", nargs="+", default=["matmul", "conv", "low", "zoo"])
    parser.add_argument("--models", nargs="+", default=["bert_base", "resnet18", "gpt2_decode"])
    args = parser.parse_args()
    where = "cuda" if args.device == "cuda" and torch.cuda.is_available() else "cpu"
    sync = runtime.get(args.device).synchronize
    tsync = torch.cuda.synchronize if where == "cuda" else (lambda: None)
    for section in args.sections:
        if section == "zoo":
            zoo_kernels(args.device, args.models, sync)
        else:
            {"matmul": matmuls, "conv": convs, "low": low_precision}[section](
                args.device, where, sync, tsync)


if __name__ == "__main__":
    main()
