"""The `portkit` command. Each subcommand's module adds its own parser through `register`."""
from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from portkit import __version__, backends, runtime

# Modules with `register(subparsers)`: each adds its subcommands and sets `run(args) -> int`
# as the parser default.
SUBCOMMAND_MODULES = ("portkit.conformance.cli", "portkit.scaffold", "portkit.cache",
                      "portkit.docs", "portkit.codegen.tune")


def show_backends(args: argparse.Namespace) -> int:
    """Prints each backend with its device, or the reason it cannot run here and the fix.
    Each is loaded in a probe process (backends.probe), so no package can end this one."""
    table = Table("backend", "status", "device, or why not and how to fix it")
    for found in backends.probe():
        style = "green" if found.status == "available" else "red"
        detail = f"{found.detail}\nfix: {found.fix}" if found.fix else found.detail
        table.add_row(found.name, Text(found.status, style=style), Text(detail))
    Console().print(table)
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand whose module is installed."""
    root = argparse.ArgumentParser(prog="portkit", description="Port a deep-learning stack to "
                                   "a new accelerator through a small, frozen ABI.")
    root.add_argument("--version", action="version", version=f"portkit {__version__}")
    subparsers = root.add_subparsers(dest="command", required=True)
    subparsers.add_parser("backends", help="list backends and whether they run here"
                          ).set_defaults(run=show_backends)
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
        runtime.debug_level()     # a bad PORTKIT_DEBUG is a usage error now, not mid-run
    except ValueError as error:
        Console(stderr=True).print(Text(f"portkit: {error}", style="red"))
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
