"""The inference zoo: real-model shapes (benchmarks/zoo.py) through portkit.onnx, beside
onnxruntime and torch in the same process.

    PYTHONPATH=. python benchmarks/models.py [--models resnet18 gru] [--backend cpu opencl]
        [--batch 1 8] [--repeat 5] [--small] [--full] [--timeout 600] [--cold]
        [--json zoo.json] [--chart zoo.png]

Each model is exported once with torch.onnx.export into exports() (~/.cache/portkit-zoo). Each
(model, backend, batch) runs in a child process, killed after `--timeout` seconds so that one
slow model does not stall the run: there the first call of portkit is timed (compiles, with
`--cold` from an empty kernel cache), then `--repeat` rounds call portkit, onnxruntime and
torch in turn (torch on the GPU when the backend is cuda and torch sees one), and the medians
are reported with the ratio to onnxruntime, the largest difference from onnxruntime's outputs
and the kernels the model compiled. One more call runs
with PORTKIT_DEBUG=2, whose per-launch lines (the runtime's own timer) give each model's five
slowest kernels; their GFLOP/s count the fused graph's arithmetic (a multiply-add is two).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from math import prod
from pathlib import Path

import platformdirs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import charts  # beside this file
import zoo

# A library's thread pool spins on after its call (onnxruntime's, libomp's for 200 ms), taking
# the cores from the next peer's threads: right after onnxruntime, portkit's call took twice
# the CPU time. Each call starts this long after the last one stopped (bench.py's SETTLE).
SETTLE = 0.3
_LAUNCH = re.compile(r"portkit: (\S+)\s+grid (\(.*?\)) block (\(.*?\))\s+([\d.]+) ms")


def debug_launches(fn) -> list[tuple[str, str, str, float]]:
    """(kernel, grid, block, ms) of every launch that fn() makes, read from PORTKIT_DEBUG=2's
    lines."""
    lines = io.StringIO()
    os.environ["PORTKIT_DEBUG"] = "2"
    try:
        with contextlib.redirect_stderr(lines):
            fn()
    finally:
        del os.environ["PORTKIT_DEBUG"]
    return [(name, grid, block, float(ms))
            for name, grid, block, ms in _LAUNCH.findall(lines.getvalue())]


def exports() -> Path:
    """Where the exports are kept: the user's cache folder for portkit-zoo, beside portkit's
    kernel cache and not in it, whose size cap (PORTKIT_CACHE_MAX_MB) would delete a 500 MB
    GPT-2 export and the kernels written before it, and which `--cold` empties."""
    return platformdirs.user_cache_path("portkit-zoo")


def kernel_flops(item) -> int:
    """Arithmetic of one scheduled kernel: each ALU op of its fused graph once per element (a
    MULACC twice), each reduce once per term."""
    from portkit.abi.ops import Op
    from portkit.graph import GraphOp, toposort

    inputs = {id(x) for x in item.inputs}
    total = 0
    for node in toposort([item.root], stop=lambda node: id(node) in inputs):
        if id(node) in inputs:
            continue
        if isinstance(node.op, Op) and node.op not in (Op.CAST, Op.BITCAST):
            total += prod(node.shape) * (2 if node.op is Op.MULACC else 1)
        elif node.op is GraphOp.REDUCE:
            total += prod(node.src[0].shape)
    return total


def slowest_kernels(model, feeds: dict, backend: str, count: int = 5) -> list[dict]:
    """The `count` slowest launches of one call under PORTKIT_DEBUG=2, with GFLOP/s where the
    launch is one of the kernels scheduled at the call's end (all of them, unless an op read
    values back midway). The call builds the model's graph (`Model.run`), whose kernels its
    replay launches: a replayed call's outputs are already computed, with no graph to count."""
    from portkit import schedule
    from portkit.tensor import Tensor

    planned: list[tuple[str, int | None]] = []

    def call() -> None:
        values = model.bind((), {k: Tensor(v, device=backend) for k, v in feeds.items()})
        env = model.run(values)
        outs = [env[name] for name in model.outputs if isinstance(env[name], Tensor)]
        items = [i for i in schedule.schedule([o.lazy for o in outs])
                 if not i.is_copy and i.root.size > 0]
        planned.extend((schedule.lower_item(i).name, kernel_flops(i)) for i in items)
        schedule.realize([o.lazy for o in outs])
    launches = [(name, grid, ms) for name, grid, _, ms in debug_launches(call)]
    flops: list[int | None] = [None] * len(launches)
    tail = launches[len(launches) - len(planned):] if planned else []
    # the device numbers a name that another kernel of its own already has (`r_1_64_1_2`)
    if len(tail) == len(planned) and all(
            launched == name or launched.startswith(name + "_")
            and launched[len(name) + 1:].isdigit()
            for (launched, _, _), (name, _) in zip(tail, planned)):
        flops[len(launches) - len(planned):] = [f for _, f in planned]
    rows = [{"kernel": name, "grid": grid, "ms": ms,
             "gflops": None if f is None or ms <= 0 else f / ms / 1e6}
            for (name, grid, ms), f in zip(launches, flops)]
    return sorted(rows, key=lambda row: -row["ms"])[:count]


def measure(name: str, size: str, batch: int, backend: str, repeat: int, threads: int,
            warm: bool = False) -> dict:
    """One row of the table (run in a child process)."""
    import numpy as np
    import onnxruntime
    import torch

    import portkit.onnx
    from portkit import runtime
    from portkit.jit import Jit

    torch.set_num_threads(threads)
    model, inputs, path = zoo.exported(name, size, batch, exports())
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(path), options, ["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    ours = portkit.onnx.load(path, device=backend)
    device = runtime.get(backend)
    builds = device.builds
    start = time.perf_counter()
    out = ours(**feeds)
    first = time.perf_counter() - start
    compiled = device.builds - builds
    # the calls after the first capture its launches for portkit.jit (with --cold, compiling
    # the kernels a replay's plan adds: 0.1-0.3 s a call for the LSTM): the rounds time replays
    for _ in range(Jit.CAPTURES):
        ours(**feeds)
    expected = session.run(None, feeds)
    error = max(float(np.abs(np.asarray(a, np.float64) - b).max())
                for a, b in zip(out.values(), expected))
    calls = {"portkit": lambda: ours(**feeds), "onnxruntime": lambda: session.run(None, feeds),
             "torch": lambda: model(*inputs)}
    torch_device = "cpu"
    if backend == "cuda" and torch.cuda.is_available():   # the GPU's peer is torch on it
        torch_device, model = "cuda", model.cuda()
        gpu_inputs = [x.cuda() for x in inputs]
        calls["torch"] = lambda: (model(*gpu_inputs), torch.cuda.synchronize())
    times: dict[str, list[float]] = {peer: [] for peer in calls}
    with torch.no_grad():
        for _ in range(repeat):          # interleaved, so a busy minute hits every peer
            for peer, call in calls.items():
                time.sleep(SETTLE)
                if warm:        # the timed call right after another: no idle before it
                    call()
                start = time.perf_counter()
                call()
                times[peer].append(time.perf_counter() - start)
    ms = {peer: statistics.median(t) * 1e3 for peer, t in times.items()}
    return {"model": name, "size": size, "batch": batch, "backend": backend,
            "ms": ms, "ratio": ms["portkit"] / ms["onnxruntime"], "first_s": first,
            "torch_device": torch_device,
            "max_error": error, "kernels": compiled,
            "slowest": slowest_kernels(ours, feeds, backend)}


def _child(conn, args: tuple, cold: bool) -> None:
    if cold:
        os.environ["PORTKIT_CACHE"] = tempfile.mkdtemp(prefix="portkit-cold-")
    try:
        conn.send(measure(*args))
    except Exception as error:  # noqa: BLE001 - reported in the table; the others still run
        conn.send({"error": f"{type(error).__name__}: {str(error)[:300]}"})


def run_isolated(args: tuple, timeout: float, cold: bool) -> dict:
    """measure(*args) in a child process, given up after `timeout` seconds."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, args, cold))
    child.start()
    return answer(receive, child, timeout)


def answer(receive, child, timeout: float) -> dict:
    """What a started child process sends on `receive`, or an error row where it gives no
    answer within `timeout` seconds (then it is killed) or dies first."""
    try:
        if not receive.poll(timeout):
            child.kill()
            return {"error": f"timeout: no answer in {timeout:.0f} s"}
        return receive.recv()
    except EOFError:
        child.join()
        return {"error": f"the child process died (exit code {child.exitcode})"}
    finally:
        child.join()


def show(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console = console if console.is_terminal else Console(width=160)   # a log keeps its rows
    table = Table(title="portkit.onnx vs onnxruntime (CPUExecutionProvider) and torch")
    for column in ("model", "backend", "batch", "portkit ms", "onnxruntime ms", "torch ms",
                   "x onnxruntime", "first call s", "max error", "kernels"):
        table.add_column(column, justify="left" if column in ("model", "backend") else "right")
    for row in rows:
        head = (row["model"], row["backend"], str(row["batch"]))
        if "error" in row:
            table.add_row(*head, f"[red]{row['error'][:60]}[/red]", *[""] * 6)
            continue
        ms = row["ms"]
        on_gpu = row.get("torch_device") == "cuda"
        torch_ms = f"{ms['torch']:.2f}" + (" (cuda)" if on_gpu else "")
        table.add_row(*head, f"{ms['portkit']:.2f}", f"{ms['onnxruntime']:.2f}", torch_ms,
                      f"{row['ratio']:.1f}", f"{row['first_s']:.1f}", f"{row['max_error']:.1e}",
                      str(row["kernels"]))
    console.print(table)
    for row in rows:
        if row.get("slowest"):
            kernels = ", ".join(
                f"{k['kernel']} {k['grid']} {k['ms']:.2f} ms"
                + ("" if k["gflops"] is None else f" {k['gflops']:.1f} GFLOP/s")
                for k in row["slowest"])
            console.print(f"[bold]{row['model']}[/bold] {row['backend']} b{row['batch']}: "
                          f"{kernels}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=None, help="default: all but --full's")
    parser.add_argument("--full", action="store_true",
                        help="add ResNet-50, and the LSTM and GRU over 200 steps")
    parser.add_argument("--backend", nargs="+", default=["cpu"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="quarter widths, small inputs")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per model")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="onnxruntime's and torch's threads")
    parser.add_argument("--cold", action="store_true", help="an empty kernel cache per model")
    parser.add_argument("--warm", action="store_true", help="time each call right after an "
                        "untimed one of the same peer, not 0.3 s after the last (both peers "
                        "pay for that idle: threads asleep, caches cold)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON "
                        "(after every row, so a run stopped midway keeps them)")
    parser.add_argument("--chart", metavar="PATH", help="also draw the ratios (.svg or .png)")
    args = parser.parse_args(argv)
    names = args.models or list(zoo.MODELS) + (list(zoo.FULL_ONLY) if args.full else [])
    size = "small" if args.small else "full"
    rows = []
    for name in names:
        for backend in args.backend:
            for batch in args.batch:
                print(f"{name} on {backend}, batch {batch} ...", flush=True)
                row = run_isolated((name, size, batch, backend, args.repeat, args.threads,
                                    args.warm), args.timeout, args.cold)
                rows.append({"model": name, "backend": backend, "batch": batch} | row)
                # written after every row, so a run stopped midway keeps what it measured
                results = {"load": os.getloadavg(), "size": size, "warm": args.warm, "rows": rows}
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1))
    show(rows)
    if args.json:
        print(f"json: {args.json}")
    if args.chart:
        charts.zoo_chart(results, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
