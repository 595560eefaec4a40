"""The benchmarks draw their charts (benchmarks/charts.py; matplotlib is the `bench` extra)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("matplotlib", reason="pip install 'portkit[bench]'")
sys.path.insert(0, str(ROOT / "benchmarks"))
import charts  # benchmarks/ is no package

ZOO = {"load": [1.5, 1.0, 1.0], "size": "full", "rows": [
    {"model": "resnet18", "backend": "cpu", "batch": 1, "ratio": 4.0,
     "ms": {"portkit": 40.0, "onnxruntime": 10.0, "torch": 20.0}},
    {"model": "vit_s16", "backend": "opencl", "batch": 8, "ratio": 0.8,
     "ms": {"portkit": 8.0, "onnxruntime": 10.0, "torch": None}},
    {"model": "gru", "backend": "cpu", "batch": 1, "error": "timed out"}]}
TRAIN = {"device": "cpu", "cold": False, "load_start": [2.0, 2.0, 2.0], "rows": [
    {"workload": "cnn", "size": "default", "threads": 1, "mode": "torch", "cpu_ms": 100.0},
    {"workload": "cnn", "size": "default", "threads": 1, "mode": "portkit", "cpu_ms": 500.0},
    {"workload": "cnn", "size": "default", "threads": 1, "mode": "portkit.jit",
     "error": "timed out"},
    {"workload": "gpt", "size": "quick", "threads": 0, "mode": "torch", "cpu_ms": 50.0},
    {"workload": "gpt", "size": "quick", "threads": 0, "mode": "portkit.jit", "cpu_ms": 40.0},
    {"workload": "lstm", "size": "default", "threads": 0, "mode": "portkit", "cpu_ms": 9.0}]}
BENCH = {"meta": {"device": "cpu", "device_name": "x86"}, "results": [
    {"workload": "matmul 1024", "unit": "GFLOP/s", "portkit": 90.0, "numpy": 100.0,
     "torch": 95.0},
    {"workload": "tiny add", "unit": "ops/s", "portkit": 5e4, "numpy": 1e6, "torch": None},
    {"workload": "MLP Adam step time, cosine / constant LR, in turns", "unit": "x",
     "portkit": 1.01, "numpy": None, "torch": None}]}


def bars(svg: str) -> int:
    """The bars of a chart's SVG (charts.bars names each one)."""
    return svg.count('<g id="bar ')


@pytest.mark.parametrize("results, labels, absent, count", [
    (ZOO, ["resnet18 cpu b1", "vit_s16 opencl b8", "vs onnxruntime", "vs torch"], ["gru"], 3),
    (TRAIN, ["cnn, 1 thr.", "gpt (quick), default thr.", "portkit.jit vs torch"], [], 2),
    # (lstm has no torch row to compare with: a label, no bar)
    (BENCH, ["matmul 1024", "tiny add", "numpy", "torch"], ["cosine"], 3),
], ids=["zoo", "train_zoo", "bench"])
def test_each_benchmark_json_draws_one_bar_per_measured_ratio(tmp_path, results, labels,
                                                              absent, count):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert charts.main([str(path)]) == 0
    svg = (tmp_path / "results.svg").read_text()
    for label in labels:
        assert label in svg
    for label in absent:
        assert label not in svg
    assert bars(svg) == count          # failed rows and peers that did not run have no bar


def test_a_png_chart_is_an_image(tmp_path):
    from matplotlib.image import imread
    charts.draw(ZOO, tmp_path / "zoo.png")
    image = imread(tmp_path / "zoo.png")
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_a_json_no_benchmark_wrote_is_refused(tmp_path):
    with pytest.raises(ValueError, match="bench.py, models.py or train_zoo.py"):
        charts.draw({"rows": []}, tmp_path / "x.svg")
