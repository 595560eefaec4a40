"""The training zoo: training steps of real-model shapes (benchmarks/train_models.py) in portkit,
eager and through portkit.jit, beside torch eager.

    PYTHONPATH=. python benchmarks/train_zoo.py [--only mlp gpt] [--device cpu] [--quick]
        [--threads 1 0] [--steps 10] [--budget 60] [--cold] [--profile] [--timeout 1200]
        [--json train_zoo.json] [--chart train_zoo.svg]

Each (workload, thread count, mode) runs in a child process of its own, so its peak memory and
its first step are its own: the first step (compiles; with `--cold`, from empty PORTKIT_CACHE
and POCL_CACHE_DIR folders) is timed, then warm-up steps (portkit.jit's captures), then up to
`--steps` timed steps (fewer once `--budget` seconds have passed, at least 3), each waited for
(`.item()` of its loss). Reported: steps/s of the median step, process CPU time per step
(time.process_time: all threads), the first step's seconds, the rise of the process's peak
resident memory (getrusage maxrss) over the steps, the first loss, and the ratios to torch
eager in the same run: of steps/s, and of CPU time per step (steadier on a busy host).
Threads: 1 sets OMP_NUM_THREADS=1 (portkit's cpu backend reads it too; PoCL has its own pool) and
torch.set_num_threads(1); 0 leaves both at their default. torch.compile is not a mode: its
Inductor compile of these steps was not tried on the 2-core host.
`--profile` adds, per portkit mode, the kernels of one step under PORTKIT_DEBUG=2 summed by
name, the top five with their share of the step's kernel time.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import charts  # beside this file

MODES = ("torch", "portkit", "portkit.jit")


def _wait(loss) -> float:
    return float(loss.item())


def kernel_profile(step, count: int = 5) -> list[dict]:
    """One call of `step` under PORTKIT_DEBUG=2: launch times summed per kernel name, the
    `count` largest with their share of all the step's kernel time."""
    from models import debug_launches  # the inference zoo's reader of PORTKIT_DEBUG=2 lines

    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, _, _, ms in debug_launches(lambda: _wait(step())):
        totals[name][0] += ms
        totals[name][1] += 1
    whole = sum(ms for ms, _ in totals.values()) or 1.0
    top = sorted(totals.items(), key=lambda item: -item[1][0])[:count]
    return [{"kernel": name, "ms": ms, "launches": n, "share": ms / whole}
            for name, (ms, n) in top] + [{"kernel": "(all)", "ms": whole,
                                          "launches": sum(n for _, n in totals.values()),
                                          "share": 1.0}]


def measure(name: str, size: str, mode: str, device: str, threads: int, steps: int,
            budget: float, profile: bool) -> dict:
    """One row of the table (run in a child process)."""
    import torch
    import train_models as tm

    if threads:
        torch.set_num_threads(threads)
    shapes = tm.workload(name, size)
    run = (tm.build_torch(name, shapes) if mode == "torch" else
           tm.build_portkit(name, shapes, device, jit=mode == "portkit.jit"))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    first_loss = _wait(run.step())
    first = time.perf_counter() - start
    warm = getattr(run.jitted, "CAPTURES", 0) + 1
    for _ in range(warm):
        _wait(run.step())
        if run.jitted is None or run.jitted.plan is not None:
            break
    seconds, cpu = [], []
    began = time.perf_counter()
    while len(seconds) < steps and (len(seconds) < 3 or time.perf_counter() - began < budget):
        wall, proc = time.perf_counter(), time.process_time()
        _wait(run.step())
        seconds.append(time.perf_counter() - wall)
        cpu.append(time.process_time() - proc)
    row = {"steps_per_s": 1 / statistics.median(seconds), "cpu_ms": statistics.median(cpu) * 1e3,
           "first_s": first, "first_loss": first_loss, "steps": len(seconds),
           "peak_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024,
           "replays": None if run.jitted is None else run.jitted.plan is not None}
    if profile and mode != "torch":
        row["kernels"] = kernel_profile(run.step)
    return row


def _child(conn, args: tuple) -> None:
    try:
        conn.send(measure(*args))
    except Exception as error:  # noqa: BLE001 - reported in the table; the others still run
        conn.send({"error": f"{type(error).__name__}: {str(error)[:300]}"})


def run_isolated(args: tuple, env: dict[str, str], timeout: float) -> dict:
    """measure(*args) in a child process started with `env` added, given up after `timeout`."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, args))
    try:
        child.start()
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value
    from models import answer  # the inference zoo's wait for a child's row

    return answer(receive, child, timeout)


def child_env(mode: str, device: str, threads: int, cold: bool) -> dict[str, str]:
    """The settings a child starts with: the thread count, the device, empty caches if cold."""
    env = {"PORTKIT_DEVICE": device}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if cold and mode != "torch":
        env["PORTKIT_CACHE"] = tempfile.mkdtemp(prefix="portkit-cold-")
        env["POCL_CACHE_DIR"] = tempfile.mkdtemp(prefix="pocl-cold-")
    return env


def show(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console = console if console.is_terminal else Console(width=140)   # a log keeps its rows
    table = Table(title=title)
    for column in ("workload", "threads", "mode", "steps/s", "CPU ms/step", "first step s",
                   "peak MiB", "vs torch", "CPU vs torch", "first loss"):
        table.add_column(column, justify="left" if column in ("workload", "mode") else "right")
    for row in rows:
        head = (row["workload"], str(row["threads"] or "default"), row["mode"])
        if "error" in row:
            table.add_row(*head, f"[red]{row['error'][:70]}[/red]", *[""] * 6)
            continue
        ratios = ["-" if row.get(key) is None else f"{row[key]:.2f}x"
                  for key in ("vs_torch", "cpu_vs_torch")]
        table.add_row(*head, f"{row['steps_per_s']:.2f}", f"{row['cpu_ms']:.1f}",
                      f"{row['first_s']:.2f}", f"{row['peak_mib']:.0f}", *ratios,
                      f"{row['first_loss']:.5f}")
    console.print(table)
    for row in rows:
        if row.get("kernels"):
            *top, whole = row["kernels"]
            kernels = ", ".join(f"{k['kernel']} {k['ms']:.1f} ms x{k['launches']} "
                                f"{k['share']:.0%}" for k in top)
            console.print(f"[bold]{row['workload']}[/bold] {row['mode']} t{row['threads']}: "
                          f"{whole['ms']:.1f} ms in {whole['launches']} launches; {kernels}",
                          highlight=False)


def main(argv: list[str] | None = None) -> int:
    import train_models as tm

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=tm.WORKLOADS, default=list(tm.WORKLOADS))
    parser.add_argument("--device", default="cpu", help="cpu, opencl or webgpu")
    parser.add_argument("--quick", nargs="*", default=None, metavar="WORKLOAD",
                        help="quick sizes for these workloads (all when none is named)")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 0],
                        help="thread counts; 0 is each library's default")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--steps", type=int, default=10, help="timed steps at most")
    parser.add_argument("--budget", type=float, default=60, help="seconds of timed steps")
    parser.add_argument("--cold", action="store_true", help="empty kernel caches per child")
    parser.add_argument("--profile", action="store_true", help="top kernels per portkit mode")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per child")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON "
                        "(after every row, so a run stopped midway keeps them)")
    parser.add_argument("--chart", metavar="PATH", help="also draw the ratios (.svg or .png)")
    args = parser.parse_args(argv)
    quick = set() if args.quick is None else set(args.quick or tm.WORKLOADS)
    rows: list[dict] = []
    load = os.getloadavg()
    for name in args.only:
        size = "quick" if name in quick else "default"
        for threads in args.threads:
            torch_row: dict = {}
            for mode in args.modes:
                print(f"{name} ({size}), {mode}, threads {threads or 'default'} ...", flush=True)
                row = run_isolated((name, size, mode, args.device, threads, args.steps,
                                    args.budget, args.profile),
                                   child_env(mode, args.device, threads, args.cold), args.timeout)
                if mode == "torch" and "error" not in row:
                    torch_row = row
                if torch_row and "error" not in row:
                    row["vs_torch"] = row["steps_per_s"] / torch_row["steps_per_s"]
                    row["cpu_vs_torch"] = torch_row["cpu_ms"] / row["cpu_ms"]
                rows.append({"workload": name, "size": size, "threads": threads, "mode": mode}
                            | row)
                # written after every row, so a run stopped midway keeps what it measured
                results = {"device": args.device, "cold": args.cold, "load_start": load,
                           "load_now": os.getloadavg(), "rows": rows}
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1))
    show(rows, f"training steps on {args.device}: portkit eager and portkit.jit vs torch eager"
               f"{' (cold caches)' if args.cold else ''}; load {load[0]:.2f}")
    if args.json:
        print(f"json: {args.json}")
    if args.chart:
        charts.train_chart(results, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
