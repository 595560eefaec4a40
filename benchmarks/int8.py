"""The zoo's ResNet-18 quantized to int8 by onnxruntime's own tool (quantize_static, QDQ,
int8 weights per output channel, uint8 activations, calibrated on 16 zoo-style inputs):
portkit's int8 and fp32 runs and onnxruntime's int8 one, in one process, interleaved, as
median [fastest-slowest] ms; then the top-1 agreement of portkit's int8 logits with the fp32
model's (in onnxruntime) and with onnxruntime's int8 ones on `--inputs` zoo-style inputs (torch.randn images,
as zoo.build's), and their largest difference from onnxruntime's.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/int8.py [--repeat 9] [--inputs 100]

OMP_NUM_THREADS sets portkit's threads and onnxruntime's intra-op threads.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnxruntime
import torch
import zoo
from models import SETTLE, exports
from onnxruntime import quantization

import portkit.onnx
from portkit.reference_backends.cpu.runtime import threads


def quantized(path, folder) -> str:
    """The int8 QDQ model of the fp32 export at `path`, made once into `folder`."""
    out = folder / (path.stem + "-int8-qdq.onnx")
    if out.exists():
        return str(out)
    pre = folder / (path.stem + "-pre.onnx")
    quantization.shape_inference.quant_pre_process(str(path), str(pre))
    feeds = iter([{"input": _image(1000 + i)} for i in range(16)])

    class Calibration(quantization.CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)
    quantization.quantize_static(
        str(pre), str(out), Calibration(), quant_format=quantization.QuantFormat.QDQ,
        per_channel=True, activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8)
    return str(out)


def _image(seed: int) -> np.ndarray:
    torch.manual_seed(seed)
    return torch.randn(1, 3, 224, 224).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--inputs", type=int, default=100)
    args = parser.parse_args()
    _, inputs, path = zoo.exported("resnet18", "full", 1, exports())
    int8 = quantized(path, exports())
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads()
    session = onnxruntime.InferenceSession(int8, options, ["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    ours, ours_fp32 = portkit.onnx.load(int8, device="cpu"), portkit.onnx.load(path, device="cpu")
    x = inputs[0].numpy()
    calls = {"portkit int8": lambda: ours(**{name: x}),
             "portkit fp32": lambda: ours_fp32(**{name: x}),
             "onnxruntime int8": lambda: session.run(None, {name: x})}
    for call in calls.values():
        for _ in range(3):       # compiles, then portkit.jit's captures
            call()
    times: dict[str, list[float]] = {peer: [] for peer in calls}
    for _ in range(args.repeat):
        for peer, call in calls.items():
            time.sleep(SETTLE)
            start = time.perf_counter()
            call()
            times[peer].append((time.perf_counter() - start) * 1e3)
    print(f"threads {threads()}, load average {os.getloadavg()[0]:.1f}")
    for peer, ms in times.items():
        print(f"{peer:18} {statistics.median(ms):7.2f} ms [{min(ms):.2f}-{max(ms):.2f}]")
    fp32 = onnxruntime.InferenceSession(str(path), options, ["CPUExecutionProvider"])
    agree_fp32, agree_ort, worst = 0, 0, 0.0
    for seed in range(args.inputs):
        image = _image(seed)
        got = next(iter(ours(**{name: image}).values()))
        expected = session.run(None, {name: image})[0]
        reference = fp32.run(None, {name: image})[0]
        agree_fp32 += int(got.argmax() == reference.argmax())
        agree_ort += int(got.argmax() == expected.argmax())
        worst = max(worst, float(np.abs(got - expected).max()))
    print(f"top-1 of portkit int8 equal to the fp32 model's on {agree_fp32} of {args.inputs}, "
          f"to onnxruntime int8's on {agree_ort}; largest |difference| from onnxruntime int8 "
          f"{worst:.4g}")


if __name__ == "__main__":
    main()
