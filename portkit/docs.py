"""`portkit docs [PAGE]`: the documentation, listed or shown in the terminal, from a checkout's
docs/ or, in an installed wheel, portkit/_docs (the same files)."""
from __future__ import annotations

import argparse
import difflib
from pathlib import Path

from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table


def folder() -> Path:
    """docs/ beside the package in a checkout, else the copy the wheel ships."""
    package = Path(__file__).parent
    for root in (package.parent / "docs", package / "_docs"):
        if (root / "abi.md").is_file():
            return root
    raise FileNotFoundError(f"no documentation beside {package}; reinstall portkit")


def pages() -> dict[str, Path]:
    """Page name (its path under docs/ without .md, e.g. "backends/cpu") -> file."""
    root = folder()
    return {path.relative_to(root).with_suffix("").as_posix(): path
            for path in sorted(root.rglob("*.md"))}


def _title(path: Path) -> str:
    return next((line.lstrip("# ").strip() for line in path.read_text().splitlines()
                 if line.startswith("# ")), "")


def _run_docs(args: argparse.Namespace) -> int:
    found, console = pages(), Console()
    if args.page is None:
        table = Table("page", "title", title=f"portkit docs PAGE  ({folder()})")
        for name, page in found.items():
            table.add_row(name, _title(page))
        console.print(table)
        return 0
    path = found.get(args.page.removesuffix(".md"))
    if path is None:
        close = difflib.get_close_matches(args.page, found, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        Console(stderr=True).print(f"portkit docs: no page {args.page!r}{hint} "
                                   "(`portkit docs` lists them)", style="red")
        return 2
    if args.path:
        print(path)
    else:
        console.print(Markdown(path.read_text()))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds `portkit docs [PAGE] [--path]` to the command line."""
    parser = subparsers.add_parser("docs", help="list the documentation pages or show one")
    parser.add_argument("page", nargs="?", help="a page name from the list, e.g. porting or "
                        "backends/cpu")
    parser.add_argument("--path", action="store_true", help="print the page's file path "
                        "instead of the page")
    parser.set_defaults(run=_run_docs)
