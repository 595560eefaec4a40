"""The inference zoo's models (benchmarks/zoo.py) at tiny widths, exported from torch and run
through portkit.onnx on every available backend, against onnxruntime: ResNet-18, MobileNetV3,
EfficientNet, ConvNeXt, ViT, BERT with a padding mask, GPT-2 prefill and decode with a KV
cache, LSTM, GRU, U-Net and a detection head (Resize, TopK, GatherElements). A model that does
not run on a backend fails there. Exports are kept in pytest's cache folder, keyed by zoo.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from portkit import backends
from portkit.onnx import load

pytest.importorskip("onnx", reason="pip install 'portkit[onnx]'")
ort = pytest.importorskip("onnxruntime", reason="pip install 'portkit[onnx]'")
pytest.importorskip("torch", reason="the models are exported from PyTorch")
pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import zoo  # benchmarks/ is no package

BACKENDS = [name for name, reason in backends.available().items() if reason is None]
# each model compiles tens of kernels on its first call: 5-100 s per model and backend on a
# loaded 2-core host (the export, once, 5-16 s)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(pytestconfig):
    """name -> (ONNX path, feeds by input name, onnxruntime's outputs), exported once."""
    folder = Path(pytestconfig.cache.mkdir("zoo"))
    found = {}

    def get(name: str):
        if name not in found:
            _, inputs, path = zoo.exported(name, "tiny", 1, folder)
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
            found[name] = path, feeds, session.run(None, feeds)
        return found[name]

    return get


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("name", zoo.MODELS)
def test_zoo_model_agrees_with_onnxruntime(exported, name, device):
    path, feeds, expected = exported(name)
    outputs = list(load(path, device=device)(**feeds).values())
    assert len(outputs) == len(expected)
    for k, (got, want) in enumerate(zip(outputs, expected)):
        assert got.shape == want.shape and got.dtype == want.dtype, (name, k)
        # normwise, as conformance's model tier: these small models do not amplify rounding
        error = float(np.abs(got.astype(np.float64) - want).max(initial=0))
        bound = 2e-4 * float(np.abs(want).max(initial=0)) + 1e-5
        assert error <= bound, f"{name} output {k} on {device}: max error {error:.3g} > {bound:.3g}"


def test_the_benchmark_gives_the_slowest_kernels_their_rate(exported):
    # the device numbers a kernel whose name another already has (`r_1_1_128_4_4_1_2`); the
    # benchmark matches its launches to the kernels it scheduled through those numbers, and a
    # replayed call (no graph) is not what it counts
    import models  # benchmarks/models.py
    path, feeds, _ = exported("resnet18")
    model = load(path, device="cpu")
    model(**feeds)
    rows = models.slowest_kernels(model, feeds, "cpu", count=40)
    assert any(row["kernel"][-2:] == "_2" for row in rows)
    assert all(row["gflops"] is not None for row in rows), rows
