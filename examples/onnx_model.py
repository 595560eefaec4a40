"""Exports a small PyTorch CNN to ONNX, runs it with portkit on every available backend, and
prints how far each backend's outputs are from onnxruntime's (or PyTorch's, without it).

Needs PyTorch and the onnx extra:
    pip install 'portkit[onnx]' torch && python examples/onnx_model.py
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

import portkit.onnx
from portkit import backends


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10)).eval()


def reference(proto, x: np.ndarray, model: torch.nn.Module) -> tuple[str, np.ndarray]:
    try:
        import onnxruntime
    except ImportError:
        return "PyTorch", model(torch.from_numpy(x)).detach().numpy()
    session = onnxruntime.InferenceSession(proto.SerializeToString())
    return "onnxruntime", session.run(None, {proto.graph.input[0].name: x})[0]


def main() -> None:
    model = small_cnn()
    x = np.random.default_rng(0).standard_normal((4, 3, 32, 32), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proto = torch.onnx.export(model, (torch.from_numpy(x),), dynamo=True,
                                  verbose=False).model_proto
    name, want = reference(proto, x, model)
    table = Table("backend", f"max |portkit - {name}|", "top-1 agrees",
                  title=f"A small CNN ({len(proto.graph.node)} ONNX nodes) on every backend")
    for device, why_not in backends.available().items():
        if why_not is not None:
            table.add_row(device, "-", f"not available: {why_not.split(';')[0]}")
            continue
        got = next(iter(portkit.onnx.load(proto, device=device)(x).values()))
        table.add_row(device, f"{np.abs(got - want).max():.2e}",
                      str(bool((got.argmax(1) == want.argmax(1)).all())))
    Console().print(table)


if __name__ == "__main__":
    main()
