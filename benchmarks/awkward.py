"""The inference zoo's awkward shapes on the CPU backend beside torch and onnxruntime: depthwise
convs (MobileNet's 3x3 s1/s2, EfficientNet's 5x5, ConvNeXt's 7x7), a depthwise conv's backward,
and matmuls whose M (ViT's 197 tokens) has no divisor up to 8; GFLOP/s, median [slowest-fastest]
of `--repeat` runs after one warm-up.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/awkward.py

With OMP_NUM_THREADS=1 every library runs on one thread (onnxruntime always does here).
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from bench import timings

from portkit import runtime
from portkit.tensor import Tensor

# (batch, channels, height, width, kernel, stride, padding): MobileNetV3's 3x3 s1 and s2,
# EfficientNet's 5x5, ConvNeXt's 7x7
DEPTHWISE = ((1, 96, 56, 56, 3, 1, 1), (1, 96, 56, 56, 3, 2, 1), (1, 240, 14, 14, 5, 1, 2),
             (1, 384, 14, 14, 7, 1, 3))
# (batch, m, k, n): ViT-S/16's projections and MLP, and its attention scores per head
MATMULS = ((1, 197, 768, 768), (1, 197, 768, 3072), (12, 197, 64, 197))


def onnx_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int):
    """An onnxruntime session (one thread) running one grouped Conv on x; None without ORT."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError:
        return None
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=x.shape[1], strides=[stride] * 2,
                            pads=[pad] * 4, kernel_shape=list(w.shape[2:]))
    graph = helper.make_graph(
        [node], "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda: session.run(None, {"x": x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", action="append", metavar="WORDS",
                        help="run only workloads whose name contains WORDS (repeatable)")
    args = parser.parse_args()
    if os.environ.get("OMP_NUM_THREADS") == "1":
        torch.set_num_threads(1)
    sync = runtime.get("cpu").synchronize
    rng = np.random.default_rng(0)
    rows = []

    def add(name, work, ours, *peers):
        if not args.only or any(words in name for words in args.only):
            rows.append((name, work, lambda: (ours().realize(), sync()), *peers))

    conv = torch.nn.functional.conv2d
    for n, c, h, w, k, s, p in DEPTHWISE:
        x, wt = rng.random((n, c, h, w), np.float32), rng.random((c, 1, k, k), np.float32)
        px, pw, tx, tw = Tensor(x).realize(), Tensor(wt).realize(), torch.from_numpy(x), \
            torch.from_numpy(wt)
        out = (h + 2 * p - k) // s + 1
        flops = 2 * n * c * out * out * k * k
        add(f"depthwise {n}x{c}x{h}x{w} {k}x{k} s{s} p{p}", flops,
            lambda px=px, pw=pw, s=s, p=p, c=c: px.conv2d(pw, stride=s, padding=p, groups=c),
            lambda tx=tx, tw=tw, s=s, p=p, c=c: conv(tx, tw, stride=s, padding=p, groups=c),
            onnx_conv(x, wt, s, p))
        gx, gw = Tensor(x, requires_grad=True), Tensor(wt, requires_grad=True)
        tgx, tgw = tx.clone().requires_grad_(), tw.clone().requires_grad_()

        def backward(gx=gx, gw=gw, s=s, p=p, c=c):
            gx.grad = gw.grad = None
            gx.conv2d(gw, stride=s, padding=p, groups=c).sum().backward()
            gw.grad.realize()
            return gx.grad

        def torch_backward(tgx=tgx, tgw=tgw, s=s, p=p, c=c):
            tgx.grad = tgw.grad = None
            conv(tgx, tgw, stride=s, padding=p, groups=c).sum().backward()

        add(f"depthwise backward {n}x{c}x{h}x{w} {k}x{k} s{s} p{p}", 2 * flops, backward,
            torch_backward, None)
    for batch, m, k, n in MATMULS:
        a, b = rng.random((batch, m, k), np.float32), rng.random((batch, k, n), np.float32)
        if batch == 1:
            a, b = a[0], b[0]
        pa, pb, ta, tb = Tensor(a).realize(), Tensor(b).realize(), torch.from_numpy(a), \
            torch.from_numpy(b)
        add(f"matmul {batch}x{m}x{k}x{n}", 2 * batch * m * k * n,
            lambda pa=pa, pb=pb: pa @ pb, lambda ta=ta, tb=tb: ta @ tb, None)
    print("workload, GFLOP/s | portkit | torch | onnxruntime   (median [slowest-fastest])")
    for name, work, *fns in rows:
        cells = []
        for fn in fns:
            if fn is None:
                cells.append("-")
                continue
            times = timings(fn, args.repeat)
            cells.append(f"{work / np.median(times) / 1e9:.2f} [{work / max(times) / 1e9:.2f}-"
                         f"{work / min(times) / 1e9:.2f}]")
        print(f"{name} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
