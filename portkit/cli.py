"""The `portkit` command. Each subcommand's module adds its own parser through `register`."""
from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from portkit import __version__, backends, cache, settings
from portkit.abi import ABI_VERSION

# Modules with `register(subparsers)`: each adds its subcommands and sets `run(args) -> int`
# as the parser default.
SUBCOMMAND_MODULES = ("portkit.conformance.cli", "portkit.scaffold", "portkit.docs")


def show_backends(args: argparse.Namespace) -> int:
    """Prints each backend with its device (a row per further device, "opencl:1"), or the
    reason it cannot run here and the fix.
    Each is loaded in a probe process (backends.probe), so no package can end this one."""
    table = Table("backend", "status", "device, or why not and how to fix it")
    for found in backends.probe():
        style = "green" if found.status == "available" else "red"
        detail = f"{found.detail}\nfix: {found.fix}" if found.fix else found.detail
        table.add_row(found.name, Text(found.status, style=style), Text(detail))
        for index, named in enumerate(found.devices[1:], 1):   # device 0 is the row above
            table.add_row(f"{found.name}:{index}", Text(found.status, style=style), Text(named))
    Console().print(table)
    return 0


def show_cache(args: argparse.Namespace) -> int:
    """`portkit cache info|clear`: the compiled-kernel cache's folder, size and entries, or
    every entry deleted."""
    if args.action == "clear":
        print(f"removed {cache.clear() / 1e6:.1f} MB from {cache.directory()}")
        return 0
    about = cache.info()
    print(f"{about['directory']}: {about['bytes'] / 1e6:.1f} MB of "
          f"{about['max_bytes'] / 1e6:.0f} MB (PORTKIT_CACHE_MAX_MB)")
    for name, entry in sorted(about["backends"].items()):
        print(f"  {name:<12} {entry['entries']:6d} files {entry['bytes'] / 1e6:9.1f} MB")
    return 0


def tune(args: argparse.Namespace) -> int:
    """`portkit tune`: times one matmul shape's LOCAL tilings on a device, keeps the fastest."""
    import numpy as np

    from portkit import runtime, schedule
    from portkit.codegen import tiles
    from portkit.schedule import search
    from portkit.tensor import Tensor

    m, k, n = args.shape
    left = Tensor(np.zeros((m, k), np.float32), device=args.device)
    right = Tensor(np.zeros((n, k) if args.transposed else (k, n), np.float32),
                   device=args.device)
    product = left @ (right.T if args.transposed else right)
    item, = schedule.create_schedule([product.lazy])
    width = len(tiles.CANDIDATES) if args.beam is None else args.beam
    if search.search(runtime.get(args.device), item.root, item.inputs, width) is None:
        Console(stderr=True).print(f"portkit tune: nothing to tune on {args.device}: it has "
                                   "no workgroup memory, or its threads are loops")
        return 1
    return 0


def profile_script(args: argparse.Namespace) -> int:
    """`portkit profile SCRIPT [ARGS...]`: runs SCRIPT as __main__ under a profile, writes the
    Chrome/Perfetto trace and prints the kernels that took the most device time."""
    import runpy

    from portkit.runtime.profile import profile

    sys.argv = [args.script, *args.args]
    code = 0
    with profile(args.output) as found:
        try:
            runpy.run_path(args.script, run_name="__main__")
        except SystemExit as stopped:
            code = stopped.code if isinstance(stopped.code, int) else int(bool(stopped.code))
    kernels = found.totals()
    total = sum(seconds for _, _, seconds in kernels) or 1.0
    table = Table("kernel", "launches", "total ms", "mean ms", "share", title="device time")
    for name, count, seconds in kernels[:args.top]:
        table.add_row(name, str(count), f"{seconds * 1e3:.3f}", f"{seconds / count * 1e3:.3f}",
                      f"{seconds / total:.0%}")
    console = Console()
    console.print(table)
    compiles = found.totals("compile")
    console.print(f"{sum(c for _, c, _ in kernels)} launches, {total * 1e3:.1f} ms of kernels; "
                  f"{sum(c for _, c, _ in compiles)} compiles, {sum(s for *_, s in compiles):.2f} s; trace: "
                  f"{args.output} (open it at https://ui.perfetto.dev)", highlight=False,
                  soft_wrap=True)
    return code


def parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand whose module is installed."""
    root = argparse.ArgumentParser(prog="portkit", description="Port a deep-learning stack to "
                                   "a new accelerator through a small, frozen ABI.")
    root.add_argument("--version", action="version",
                      version=f"portkit {__version__} (backend ABI {ABI_VERSION})")
    subparsers = root.add_subparsers(dest="command", required=True)
    subparsers.add_parser("backends", help="list backends and whether they run here"
                          ).set_defaults(run=show_backends)
    caches = subparsers.add_parser("cache", help="show or empty the compiled-kernel cache")
    caches.add_argument("action", choices=("info", "clear"),
                        help="info: folder, size and entries; clear: delete every entry")
    caches.set_defaults(run=show_cache)
    tuning = subparsers.add_parser("tune", help="time a matmul's LOCAL tilings on a device and "
                                   "keep the fastest in the cache")
    tuning.add_argument("--device", required=True, help="backend name, e.g. opencl")
    tuning.add_argument("--shape", type=int, nargs=3, metavar=("M", "K", "N"),
                        default=(1024, 1024, 1024))
    tuning.add_argument("--transposed", action="store_true", help="time x @ W.T (W is N x K)")
    tuning.add_argument("--beam", type=int, default=None,
                        help="how many tilings to time (default: all)")
    tuning.set_defaults(run=tune)
    profiling = subparsers.add_parser("profile", help="run a Python script and show where "
                                      "its kernel time goes (writes a Perfetto trace)")
    profiling.add_argument("script", help="the Python file to run as __main__ (options of "
                           "`portkit profile` come before it)")
    profiling.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    profiling.add_argument("-o", "--output", default="portkit-trace.json",
                           help="where to write the trace (default: portkit-trace.json)")
    profiling.add_argument("--top", type=int, default=15, help="kernels to list (default 15)")
    profiling.set_defaults(run=profile_script)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if not (name + ".").startswith(f"{error.name}."):
                raise
            continue    # a subcommand that is not part of this install
        module.register(subparsers)
    return root


def main(argv: list[str] | None = None) -> int:
    """Runs the command line `argv` (default: sys.argv) and returns the exit code."""
    args = parser().parse_args(argv)
    try:
        settings.launch()     # a bad PORTKIT_DEBUG or PORTKIT_CHECK is a usage error now
    except ValueError as error:
        Console(stderr=True).print(Text(f"portkit: {error}", style="red"))
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
