"""The benchmarks draw their charts (matplotlib is the `bench` extra)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("torch", reason="benchmarks/models.py builds its models in torch")


def test_the_zoo_chart_has_a_bar_per_measured_model(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="pip install 'portkit[bench]'")
    from matplotlib.image import imread
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT))
    sys.modules.pop("models", None)
    import models
    rows = [{"model": "resnet18", "backend": "cpu", "batch": 1, "ratio": 4.0},
            {"model": "vit", "backend": "cpu", "batch": 1, "ratio": 0.8},
            {"model": "gru", "backend": "cpu", "batch": 1, "error": "timed out"}]
    models.chart(rows, str(tmp_path / "zoo.png"))
    image = imread(tmp_path / "zoo.png")
    assert image.shape[0] > 100 and image.shape[1] > 100
