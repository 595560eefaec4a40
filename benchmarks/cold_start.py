"""Cold start: the first call of a small ONNX CNN or of ResNet-18 (ONNX, 1x3x224x224) and the
first SGD step of an MLP (784-512-512-10, batch 64) on one device, with the kernel caches empty.

    PORTKIT_CACHE=$(mktemp -d) POCL_CACHE_DIR=$(mktemp -d) PYTHONPATH=. \
        python benchmarks/cold_start.py cnn cpu

`what` is cnn, resnet18 or mlp. Prints one line: what, device, wall seconds, the CPU seconds
of this process and of its child processes (the C compiler) together, and on cpu the number of
C compiler processes, counted through a PORTKIT_CC wrapper (unless PORTKIT_CC is set). ResNet-18
is exported with torch (benchmarks/zoo.py) into the temporary folder before the clock starts.
Run each in a fresh process with fresh caches.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def cnn():
    """A small CNN made with onnx.helper: three 3x3 convs with ReLU and max pools, global
    average pool, a linear layer; 1x3x32x32 in, 10 out."""
    import onnx
    from onnx import helper

    rng = np.random.default_rng(0)
    nodes, weights, x, channels = [], {}, "x", 3
    for i, width in enumerate((16, 32, 64)):
        weights[f"w{i}"] = rng.standard_normal((width, channels, 3, 3)) * 0.1
        weights[f"b{i}"] = rng.standard_normal(width) * 0.1
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2],
                                   strides=[2, 2])]
        x, channels = f"p{i}", width
    weights["fc"], weights["fb"] = rng.standard_normal((64, 10)), rng.standard_normal(10)
    nodes += [helper.make_node("GlobalAveragePool", [x], ["g"]),
              helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "fc", "fb"], ["y"])]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                     [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def resnet18() -> Path:
    """ResNet-18 (benchmarks/zoo.py) exported to ONNX at batch 1, kept with the model zoo's
    exports (the export takes seconds of torch, not portkit)."""
    import models
    import zoo

    return zoo.exported("resnet18", "full", 1, models.exports())[2]


def first_onnx_call(model, shape: tuple[int, ...], device: str) -> None:
    from portkit.onnx import load

    load(model, device=device)(np.ones(shape, np.float32))


def first_mlp_step(device: str) -> None:
    from portkit import nn, optim
    from portkit.tensor import Tensor

    layers = [nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)]
    params = [p for layer in layers for p in layer.parameters()]
    opt = optim.SGD(params, lr=0.01)
    x = Tensor(np.random.default_rng(0).standard_normal((64, 784), np.float32), device=device)
    y = Tensor(np.arange(64, dtype=np.int32) % 10, device=device)
    opt.zero_grad()
    loss = layers[2](layers[1](layers[0](x).relu()).relu()).cross_entropy(y)
    loss.backward()
    opt.step()
    loss.item()


def counting_compiler(folder: Path) -> Path:
    """A PORTKIT_CC wrapper around clang (else gcc) that appends a line to `folder`/count at
    each run; returns the count file."""
    count, wrapper = folder / "count", folder / "cc"
    compiler = shutil.which("clang") or shutil.which("gcc") or "cc"
    wrapper.write_text(f'#!/bin/sh\necho >> "{count}"\nexec {compiler} "$@"\n')
    wrapper.chmod(0o755)
    os.environ["PORTKIT_CC"] = str(wrapper)
    return count


if __name__ == "__main__":
    what, device = sys.argv[1], sys.argv[2]
    os.environ["PORTKIT_DEVICE"] = device
    counted = None
    if device == "cpu" and "PORTKIT_CC" not in os.environ:
        counted = counting_compiler(Path(tempfile.mkdtemp(prefix="portkit-cc-count-")))
    model = {"cnn": cnn, "resnet18": resnet18, "mlp": lambda: None}[what]()
    import portkit  # noqa: F401 - imported before the clock starts

    start, times = time.perf_counter(), os.times()
    if what == "mlp":
        first_mlp_step(device)
    else:
        first_onnx_call(model, (1, 3, 224, 224) if what == "resnet18" else (1, 3, 32, 32), device)
    wall, after = time.perf_counter() - start, os.times()
    cpu = sum(after[:4]) - sum(times[:4])
    processes = "" if counted is None else \
        f" compiler processes {len(counted.read_text().splitlines()) if counted.exists() else 0}"
    print(f"{what} {device} wall {wall:.2f} s cpu {cpu:.2f} s{processes}")
