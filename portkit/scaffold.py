"""`portkit new-backend NAME`: a standalone backend package, rendered from templates/backend.

The package, `portkit-NAME`, registers through the `portkit.backends` entry point, so portkit
itself never changes. Starters: `c` (the cpu reference backend: passes `portkit conform` at
once), `opencl` (the opencl reference backend), `llvm` (LLVM IR through portkit's LLVM renderer
base, compiled by llvmlite and run on the host: passes `portkit conform` at once), `vulkan`
(GLSL compute shaders from the C-style renderer base, SPIR-V by glslangValidator, launched
through the `vulkan` binding: passes on lavapipe) and `blank`
(every part raises NotImplementedError naming the section of docs/porting.md to read). cookiecutter renders the
template; it writes only into the output folder and a temporary folder for its replay files.
cookiecutter is the `scaffold` extra (`pip install 'portkit[scaffold]'`): users who never
scaffold do not install it, and `new-backend` names the extra when it is missing.

The `c` and `opencl` starters are not copies kept by hand: the template's post-generation hook
writes the reference backend's device.py, capabilities.py, renderer.py and runtime.py with their
names changed (`starter_files`), so a starter cannot drift from the backend it starts from.
"""
from __future__ import annotations

import argparse
import keyword
import re
import sys
import tempfile
from collections.abc import Collection
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.prompt import Prompt

from portkit import __version__, backends
from portkit.abi import PortkitError

STARTERS = {
    "c": "the cpu reference backend: C built by the host C compiler; passes conformance at once",
    "opencl": "the opencl reference backend: OpenCL C through pyopencl, for an OpenCL driver",
    "llvm": "LLVM IR through llvmlite (pip install 'portkit[llvm]'), run on the host CPU; "
            "passes conformance at once",
    "vulkan": "GLSL 450 compute shaders, SPIR-V by glslangValidator, run through the vulkan "
              "binding (pip install vulkan; apt-get install glslang-tools), on lavapipe here",
    "blank": "every part raises NotImplementedError that says what to write",
}
NAME_RULE = ("a backend name is lowercase ASCII letters, digits and underscores, starts with a "
             "letter, and is not a Python keyword, e.g. 'myaccel'")


# starter -> (the reference backend it is, the prefix of that backend's class names)
REFERENCES = {"c": ("cpu", "CPU"), "opencl": ("opencl", "OpenCL")}
PARTS = ("device", "capabilities", "renderer", "runtime")


class ScaffoldError(PortkitError):
    """A backend package cannot be generated as asked; the message says what to change."""


def _cookiecutter():
    """cookiecutter's entry function; ScaffoldError naming the extra when it is missing."""
    try:
        from cookiecutter.main import cookiecutter
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "cookiecutter":
            raise
        raise ScaffoldError("`portkit new-backend` renders its template with cookiecutter, "
                            "which is not installed; pip install 'portkit[scaffold]'") from None
    return cookiecutter


def template_dir() -> Path:
    """The cookiecutter template: templates/backend in a checkout, portkit/_templates/backend
    in an installed wheel (pyproject.toml maps one to the other)."""
    package = Path(__file__).resolve().parent
    for root in (package.parent / "templates", package / "_templates"):
        if (root / "backend" / "cookiecutter.json").is_file():
            return root / "backend"
    raise ScaffoldError(f"the backend template is missing from {package}; reinstall portkit")


def title(name: str) -> str:
    """The class-name prefix for a backend name: my_npu2 -> MyNpu2 (as cookiecutter.json's)."""
    return "".join(word.capitalize() for word in name.split("_"))


def starter_files(starter: str, name: str) -> dict[str, str]:
    """{part: source} of the parts that the `starter` takes from a reference backend, renamed
    for the backend `name`: its module, its class names, its name. {} for `blank`."""
    if starter not in REFERENCES:
        return {}
    reference, prefix = REFERENCES[starter]
    folder = resources.files("portkit.reference_backends").joinpath(reference)
    classes = re.compile(rf"\b{prefix}(?=(?:Allocator|Compiler|Program|Renderer)\b)")
    files = {}
    for part in PARTS:
        text = folder.joinpath(f"{part}.py").read_text()
        text = text.replace(f"portkit.reference_backends.{reference}.", f"portkit_{name}.")
        text = classes.sub(title(name), text)
        files[part] = text.replace(f'"{reference}"', f'"{name}"')
    return files


def _taken(force: bool) -> set[str]:
    """Backend names in use: portkit's own always, other installed ones unless `force`."""
    return {point.name for point in backends.entry_points()
            if not force or point.value.startswith("portkit.")}


def suggest_name(name: str, taken: Collection[str] = frozenset()) -> str:
    """A valid backend name close to `name` and not in `taken`: My-Accel -> my_accel,
    1npu -> accel_1npu, class -> class_accel, cpu (taken) -> cpu2, or cpu3 if that is too."""
    base = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "myaccel"
    if not base[0].isalpha():
        base = f"accel_{base}"
    if keyword.iskeyword(base) or keyword.issoftkeyword(base):
        base = f"{base}_accel"
    if base not in taken:
        return base
    number = 2
    while f"{base}{number}" in taken:
        number += 1
    return f"{base}{number}"


def check_name(name: str, force: bool = False) -> None:
    """Raises ScaffoldError, naming the rule and a valid name to use instead, unless `name`
    can be used.

    A name that an installed package already registers is refused too; with `force` only the
    reference backends' names are (regenerating your own installed backend is then allowed).
    """
    taken = _taken(force)
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ScaffoldError(f"invalid backend name {name!r}: {NAME_RULE}; try "
                            f"{suggest_name(name, taken)!r}")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise ScaffoldError(f"invalid backend name {name!r}: it is a Python keyword, and "
                            f"{NAME_RULE}; try {suggest_name(name, taken)!r}")
    if name in taken:
        again = "" if force else " (or pass --force to regenerate your own installed backend)"
        raise ScaffoldError(f"backend name {name!r} is taken by an existing backend "
                            f"({', '.join(sorted(taken))}); choose another, e.g. "
                            f"{suggest_name(name, taken)!r} or 'myaccel'{again}")


def generate(name: str, output_dir: str | Path = ".", starter: str = "c",
             force: bool = False, description: str | None = None,
             author: str = "Your Name") -> Path:
    """Renders portkit-NAME into `output_dir` and returns its folder. Raises ScaffoldError."""
    check_name(name, force)
    if starter not in STARTERS:
        raise ScaffoldError(f"unknown starter {starter!r}; use one of {', '.join(STARTERS)}")
    target = Path(output_dir) / f"portkit-{name}"
    if target.exists() and not force:
        raise ScaffoldError(f"{target} already exists; pass --force to overwrite the generated "
                            "files in it, or choose another --output-dir")
    context = {"name": name, "starter": starter, "author": author,
               "description": description or f"portkit backend for the {name} accelerator",
               "_portkit_version": __version__, "_portkit_below": _next_minor(__version__)}
    with tempfile.TemporaryDirectory(prefix="portkit-new-backend-") as scratch:
        # Without these, cookiecutter keeps replay files and templates in the user's home.
        config = {"replay_dir": str(Path(scratch) / "replay"),
                  "cookiecutters_dir": str(Path(scratch) / "cookiecutters")}
        try:
            created = _cookiecutter()(str(template_dir()), no_input=True, extra_context=context,
                                   output_dir=str(output_dir), overwrite_if_exists=force,
                                   default_config=config)
        except OSError as error:
            raise ScaffoldError(f"cannot write {target}: {error}; choose another "
                                "--output-dir") from None
    return Path(created)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds the `new-backend` subcommand."""
    command = subparsers.add_parser(
        "new-backend", help="generate a standalone backend package to start a port from",
        description="Writes portkit-NAME/: a Python package with a renderer, runtime, "
                    "capabilities, tests and a CI script, registered through the "
                    "portkit.backends entry point. Then: pip install -e ./portkit-NAME && "
                    "portkit conform --backend NAME. Guide: docs/porting.md. Needs "
                    "cookiecutter: pip install 'portkit[scaffold]'.",
        epilog="exit codes: 0 written, 2 not written (bad or taken name, no answer at a "
               "prompt, cookiecutter missing), 130 cancelled with Ctrl-C")
    command.add_argument("name", help="the backend's name, e.g. myaccel (lowercase letters, "
                         "digits and underscores, starting with a letter)")
    command.add_argument("--output-dir", default=".", help="where portkit-NAME/ is written "
                         "(default: the current folder)")
    command.add_argument("--from", dest="starter", choices=sorted(STARTERS),
                         help="the starter: " + "; ".join(f"{k}: {v}" for k, v in
                                                          STARTERS.items()) + " (default c)")
    command.add_argument("--no-input", action="store_true",
                         help="ask nothing (also when stdin is not a terminal); use the "
                         "defaults for what the options do not give")
    command.add_argument("--force", action="store_true",
                         help="overwrite the generated files of an existing portkit-NAME/")
    command.set_defaults(run=run)


# Exit codes: 2 for every "not written" the user can fix; 130 for Ctrl-C, as a shell reports it.
EXIT_WRITTEN, EXIT_NOT_WRITTEN, EXIT_INTERRUPTED = 0, 2, 130


def run(args: argparse.Namespace) -> int:
    """`portkit new-backend`: 0 when the package was written, 2 when it was not (a bad name,
    a prompt left without an answer), 130 when Ctrl-C cancelled it."""
    console = Console()
    starter, description, author = args.starter or "c", None, "Your Name"
    try:
        check_name(args.name, args.force)
        if not args.no_input and sys.stdin.isatty():   # a script's empty stdin asks nothing
            starter = args.starter or Prompt.ask("starter", choices=list(STARTERS), default="c",
                                                 console=console)
            description = Prompt.ask("description", console=console, default=(
                f"portkit backend for the {args.name} accelerator"))
            author = Prompt.ask("author", default=author, console=console)
        created = generate(args.name, args.output_dir, starter, args.force, description, author)
    except ScaffoldError as error:
        console.print(f"[red]{escape(str(error))}[/]", highlight=False)
        return EXIT_NOT_WRITTEN
    except EOFError:
        console.print("\n[red]no answer (end of input) at a prompt; nothing was written.[/] "
                      "Answer the prompts, or pass --no-input with --from to use the defaults.",
                      highlight=False)
        return EXIT_NOT_WRITTEN
    except KeyboardInterrupt:
        console.print("\n[yellow]cancelled; nothing was written[/]", highlight=False)
        return EXIT_INTERRUPTED
    folder = _shown(created)
    console.print(f"wrote {folder}/ (starter: {starter}). Next:\n"
                  f"  pip install -e {folder}\n"
                  f"  portkit conform --backend {args.name} --quick\n"
                  f"then follow {folder}/README.md (the porting steps).", highlight=False)
    return 0


def _shown(path: Path) -> str:
    """`path` as ./relative when inside the current folder, else absolute."""
    try:
        return f"./{path.resolve().relative_to(Path.cwd().resolve())}"
    except ValueError:
        return str(path.resolve())


def _next_minor(version: str) -> str:
    """The first release a package written against `version` must stay below ("0.1.0" ->
    "0.2"): before 1.0 a minor release may change the ABI."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return f"{major}.{minor + 1}" if major == 0 else f"{major + 1}.0"
