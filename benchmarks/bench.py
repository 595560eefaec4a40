"""portkit vs numpy and PyTorch on the issue's workloads: medians, and ratios to the peers.

    PYTHONPATH=. python benchmarks/bench.py [--device cpu] [--repeat 5] [--json out.json]
                                            [--chart out.svg] [--only "MLP"]

PyTorch runs on the GPU when `--device` is a GPU backend and torch sees CUDA, else on the CPU.
Each timed run ends by waiting for the device (portkit's synchronize, torch.cuda.synchronize).

Rates are work / median seconds per call over `--repeat` timed runs, after one warm-up run
(compiles, caches, page faults); a run of a workload that takes microseconds calls it many times. A peer that is not installed shows as "-".
Below the table, the Adam step's time with a cosine learning rate over its time with a constant
one, the two timed in turns (`in_turns`): the rows, timed a minute apart, swing more than that.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console
from rich.table import Table

import portkit
from portkit import nn, optim, runtime
from portkit.tensor import Tensor

try:
    import torch
except ImportError:
    torch = None

Case = tuple[str, str, float, Callable, Callable | None, Callable | None]


# A timed run lasts at least this long: a workload of microseconds runs several times in a row
# (as timeit does), since one call's time holds the clock's own cost and each call's misses.
MIN_RUN = 2e-3


def timings(fn: Callable, repeat: int) -> list[float]:
    """Seconds per call of `repeat` timed runs of fn, after one warm-up run (compiles, caches,
    page faults); a run calls fn enough times in a row to last MIN_RUN, as a second call says."""
    fn()
    start = time.perf_counter()
    fn()
    calls = max(1, min(10_000, int(MIN_RUN / max(time.perf_counter() - start, 1e-7))))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return times


# After a parallel region each library's threads keep spinning a while (clang's libomp: 200 ms
# by default; torch's libgomp and OpenBLAS less; portkit's pool 100 us), so on a machine of few
# cores the library timed next ran on part of it: torch's conv2d read 55 GFLOP/s right after
# portkit's (then OpenMP's), 180 with the spinning turned off. Each library starts its timings
# this long after the last one stopped.
SETTLE = 0.3


def median_seconds(fn: Callable, repeat: int) -> float:
    time.sleep(SETTLE)
    return statistics.median(timings(fn, repeat))


def in_turns(first: Callable, second: Callable, rounds: int = 40, calls: int = 5) -> float:
    """second's median seconds per call over first's, timed in turns (`calls` calls of one,
    then of the other, `rounds` times): two configurations of portkit compared in the same
    minutes. The Adam rows, a minute apart, gave cosine/constant ratios of 0.86-1.41."""
    times: tuple[list[float], list[float]] = ([], [])
    for fn in (first, second):
        fn()
    for _ in range(rounds):
        for fn, runs in zip((first, second), times):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            runs.append((time.perf_counter() - start) / calls)
    return statistics.median(times[1]) / statistics.median(times[0])


def _floats(*shape: int) -> np.ndarray:
    return np.random.default_rng(sum(shape)).random(shape, np.float32)


def torch_device(device: str) -> str:
    """Where torch runs beside portkit's `device`: CUDA for a GPU backend when torch has it."""
    gpu = device not in ("cpu", "interpreter") and torch is not None and torch.cuda.is_available()
    return "cuda" if gpu else "cpu"


def _waiting(fn: Callable, wait: Callable) -> Callable:
    def run():
        fn()
        wait()
    return run


def cases(device: str) -> list[Case]:
    """(name, unit, work per run, portkit, numpy, torch) for every workload."""
    def put(a: np.ndarray) -> Tensor:
        return Tensor(a, device=device).realize()

    big = 1 << 26                       # 256 MiB of float32
    n = 1 << 24
    copy_np = _floats(big)
    copy = put(copy_np)
    a_np, b_np, c_np = _floats(n), _floats(n) + 1, _floats(n) + 2
    a, b, c = put(a_np), put(b_np), put(c_np)
    m_np, m2_np = _floats(1024, 1024), _floats(1024, 1024) + 1
    m, m2 = put(m_np), put(m2_np)
    s_np, s2_np, l_np, l2_np = _floats(512, 512), _floats(512, 512), _floats(2048, 2048), \
        _floats(2048, 2048)
    s, s2, big_m, big_m2 = put(s_np), put(s2_np), put(l_np), put(l2_np)
    h_np, hw_np = _floats(64, 784), _floats(512, 784)     # the MLP's first layer, forward
    h, hw = put(h_np), put(hw_np)
    x_np, w_np = _floats(8, 64, 56, 56), _floats(64, 64, 3, 3)
    x, w = put(x_np), put(w_np)
    one_np = np.ones(4, np.float32)
    one = put(one_np)
    mlp_step = _portkit_mlp(device)
    conv_flops = 2 * 8 * 64 * 56 * 56 * 64 * 9
    rows: list[Case] = [
        ("copy 256 MiB", "GB/s", 2 * 4 * big, lambda: copy.contiguous().realize(),
         lambda: copy_np.copy(), None),
        ("fused 4-op chain 16M", "GB/s", 4 * 4 * n,
         lambda: ((a * b + c).relu() * 2).realize(),
         lambda: np.maximum(a_np * b_np + c_np, 0) * 2, None),
        ("sum 16M", "GB/s", 4 * n, lambda: a.sum().realize(), lambda: a_np.sum(), None),
        ("matmul 1024", "GFLOP/s", 2 * 1024 ** 3, lambda: (m @ m2).realize(),
         lambda: m_np @ m2_np, None),
        ("matmul 512", "GFLOP/s", 2 * 512 ** 3, lambda: (s @ s2).realize(),
         lambda: s_np @ s2_np, None),
        ("matmul 2048", "GFLOP/s", 2 * 2048 ** 3, lambda: (big_m @ big_m2).realize(),
         lambda: l_np @ l2_np, None),
        ("MLP forward x @ W.T 64x784x512", "GFLOP/s", 2 * 64 * 784 * 512,
         lambda: (h @ hw.T).realize(), lambda: h_np @ hw_np.T, None),
        ("conv2d 8x64x56x56 3x3", "GFLOP/s", conv_flops, lambda: x.conv2d(w, padding=1).realize(),
         None, None),
        ("conv2d backward 8x64x56x56 3x3", "GFLOP/s", 2 * conv_flops,
         _conv_backward(x_np, w_np, device), None, None),
        ("tiny add end to end", "ops/s", 1, lambda: (one + 1).numpy(), lambda: one_np + 1, None),
        ("MLP 784-512-512-10 SGD step", "steps/s", 1, mlp_step, None, None),
        ("MLP Adam step, constant LR", "steps/s", 1, _portkit_mlp(device, "adam"), None, None),
        ("MLP Adam step, cosine LR", "steps/s", 1, _portkit_mlp(device, "cosine"), None, None),
        ("x * float(i), 4096 floats", "ops/s", 1, _changing_number(put(_floats(4096))), None,
         None),
        ("MLP SGD first step, empty cache", "steps/s", 1, _cold_mlp(device), None, None),
        ("MLP SGD step, portkit.jit", "steps/s", 1, _portkit_mlp(device, jitted=True), None,
         None),
        ("3-op function on 16 floats, portkit.jit", "ops/s", 1, _three_ops(put, jitted=True),
         None, None),
        ("3-op function on 16 floats, eager", "ops/s", 1, _three_ops(put), None, None),
    ]
    synchronize = runtime.get(device).synchronize
    rows = [row[:3] + (_waiting(row[3], synchronize),) + row[4:] for row in rows]
    if torch is None:
        return rows
    where = torch_device(device)
    ta, tb, tc, tm, tm2, tx, tw, tone, tcopy = (torch.from_numpy(v).to(where) for v in (
        a_np, b_np, c_np, m_np, m2_np, x_np, w_np, one_np, copy_np))
    ts, ts2, tl, tl2, th, thw = (torch.from_numpy(v).to(where) for v in (
        s_np, s2_np, l_np, l2_np, h_np, hw_np))
    conv = torch.nn.functional.conv2d
    tsmall = torch.from_numpy(_floats(4096)).to(where)

    def torch_put(a: np.ndarray):
        return torch.from_numpy(a).to(where)
    torch_fns = [lambda: tcopy.clone(), lambda: ((ta * tb + tc).relu() * 2), lambda: ta.sum(),
                 lambda: tm @ tm2, lambda: ts @ ts2, lambda: tl @ tl2, lambda: th @ thw.T,
                 lambda: conv(tx, tw, padding=1), _torch_conv_backward(tx, tw),
                 lambda: (tone + 1).cpu().numpy(), _torch_mlp(where),
                 _torch_mlp(where, "adam"), _torch_mlp(where, "cosine"),
                 _changing_number(tsmall), None, _torch_mlp(where), _three_ops(torch_put),
                 _three_ops(torch_put)]
    wait = torch.cuda.synchronize if where == "cuda" else lambda: None
    return [row[:5] + (_waiting(fn, wait) if fn else None,) for row, fn in zip(rows, torch_fns)]


def _conv_backward(x: np.ndarray, w: np.ndarray, device: str) -> Callable:
    """Both gradients of conv2d(x, w, padding=1).sum() (twice the forward's work), realized."""
    x, w = (Tensor(a, device=device, requires_grad=True).realize() for a in (x, w))

    def run() -> None:
        x.grad = w.grad = None
        x.conv2d(w, padding=1).sum().backward()
        portkit.tensor.realize(x.grad, w.grad)
    return run


def _torch_conv_backward(x, w) -> Callable:
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()

    def run() -> None:
        x.grad = w.grad = None
        torch.nn.functional.conv2d(x, w, padding=1).sum().backward()
    return run


def _learning_rate(opt, rule: str, counter: list[int]) -> None:
    """A cosine learning-rate schedule over 100 steps (rule "cosine"); else the rate stays."""
    counter[0] += 1
    if rule == "cosine":
        lr = 1e-3 * 0.5 * (1 + math.cos(math.pi * (counter[0] % 100) / 100))
        for group in getattr(opt, "param_groups", [opt]):
            if isinstance(group, dict):
                group["lr"] = lr
            else:
                group.lr = lr


def _changing_number(x) -> Callable:
    """x * float(i) with a new i every call: the number must not cost a compile."""
    counter = [0]

    def run() -> None:
        counter[0] += 1
        out = x * float(counter[0])
        if isinstance(out, Tensor):
            out.realize()
    return run


def _three_ops(put: Callable, jitted: bool = False) -> Callable:
    """(a * b + c).relu() on 16 floats: a call's Python and launch cost, nothing else."""
    a, b, c = (put(_floats(16) - k) for k in range(3))

    def three(a, b, c):
        return (a * b + c).relu()
    fn = portkit.jit(three) if jitted else three

    def run() -> None:
        out = fn(a, b, c)
        if isinstance(out, Tensor):
            out.realize()
    return _replaying(run, fn)


def _cold_mlp(device: str) -> Callable:
    """The first SGD step of a new MLP with empty in-memory and disk kernel caches."""
    def run() -> None:
        with tempfile.TemporaryDirectory() as folder:
            saved = os.environ.get("PORTKIT_CACHE")
            os.environ["PORTKIT_CACHE"] = folder
            try:
                runtime.clear()
                _portkit_mlp(device)()
            finally:
                if saved is None:
                    del os.environ["PORTKIT_CACHE"]
                else:
                    os.environ["PORTKIT_CACHE"] = saved
    return run


def _portkit_mlp(device: str, rule: str = "sgd", jitted: bool = False) -> Callable:
    layers = [nn.Linear(784, 512), nn.Linear(512, 512), nn.Linear(512, 10)]
    params = [p for layer in layers for p in layer.parameters()]
    opt = optim.SGD(params, lr=0.01) if rule == "sgd" else optim.Adam(params, lr=1e-3)
    x = Tensor(_floats(64, 784), device=device)
    y = Tensor(np.arange(64, dtype=np.int32) % 10, device=device)
    counter = [0]

    def train(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        h = layers[1](layers[0](x).relu()).relu()
        loss = layers[2](h).cross_entropy(y)
        loss.backward()
        opt.step()
        return loss
    train = portkit.jit(train) if jitted else train

    def step() -> None:
        _learning_rate(opt, rule, counter)
        train(x, y).item()
    return _replaying(step, train)


def _replaying(run: Callable, fn: Callable) -> Callable:
    """`run`; when `fn` is a portkit.jit function, its first call first calls `run` until `fn`
    replays, so that the timed calls of a jitted row are replays (the captures are warm-up)."""
    if not hasattr(fn, "CAPTURES"):
        return run

    def replay() -> None:
        for _ in range(fn.CAPTURES):
            if fn.plan is not None:
                break
            run()
        run()
    return replay


def _torch_mlp(where: str, rule: str = "sgd") -> Callable:
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(where)
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if rule == "sgd" else \
        torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.from_numpy(_floats(64, 784)).to(where)
    y = (torch.arange(64) % 10).to(where)
    counter = [0]

    def step() -> None:
        _learning_rate(opt, rule, counter)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--chart", metavar="PATH", help="also draw the ratios (.svg or .png)")
    parser.add_argument("--only", action="append", metavar="WORDS",
                        help="run only workloads whose name contains WORDS (repeatable)")
    args = parser.parse_args()
    os.environ["PORTKIT_DEVICE"] = args.device     # where nn layers put their parameters
    device = runtime.get(args.device)
    where = torch_device(args.device) if torch else "-"
    table = Table(title=f"portkit on {args.device}: {device.capabilities.device_name}; "
                        f"torch on {where}")
    for column in ("workload", "unit", "portkit", "numpy", f"torch ({where})", "pk/numpy",
                   "pk/torch"):
        table.add_column(column, justify="left" if column == "workload" else "right")
    results = []
    for name, unit, work, *fns in cases(args.device):
        if args.only and not any(words in name for words in args.only):
            continue
        rates = [work / median_seconds(fn, args.repeat) / (1 if unit in ("ops/s", "steps/s")
                                                             else 1e9) if fn else None
                 for fn in fns]
        ours, numpy_rate, torch_rate = rates
        results.append({"workload": name, "unit": unit, "portkit": ours, "numpy": numpy_rate,
                        "torch": torch_rate})
        table.add_row(name, unit, *(_cell(r) for r in rates),
                      _cell(ours / numpy_rate if numpy_rate else None, ratio=True),
                      _cell(ours / torch_rate if torch_rate else None, ratio=True))
    Console(width=120).print(table)
    if not args.only or any(words in "MLP Adam step, cosine LR" for words in args.only):
        ratio = in_turns(_portkit_mlp(args.device, "adam"), _portkit_mlp(args.device, "cosine"))
        results.append({"workload": "MLP Adam step time, cosine / constant LR, in turns",
                        "unit": "x", "portkit": ratio, "numpy": None, "torch": None})
        print(f"MLP Adam step time, cosine / constant LR, in turns: {ratio:.3f}x")
    if args.json or args.chart:
        meta = {"device": args.device, "device_name": device.capabilities.device_name,
                "machine": platform.processor() or platform.machine(),
                "numpy": np.__version__, "torch": torch.__version__ if torch else None,
                "torch_device": where,
                "repeat": args.repeat}
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"meta": meta, "results": results}, out, indent=2)
        if args.chart:
            import charts  # beside this file; benchmarks/ is no package
            charts.bench_chart({"meta": meta, "results": results}, args.chart)


def _cell(value: float | None, ratio: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if ratio else f"{value:,.2f}"


if __name__ == "__main__":
    main()
