"""The package's layers, held: data flows down only, and no module imports its way back to itself.

Every import of a portkit module counts, at the top of a file or inside a function (an import
moved into a function still makes the layer below depend on the one above), except those under
`if TYPE_CHECKING:`, which are for type checkers only. The layers, lowest first; a module may
import its own layer and those below it:
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "portkit"

LAYERS = [
    ["portkit.abi", "portkit.settings"],
    ["portkit.symbolic"],
    ["portkit.view"],
    ["portkit.graph"],
    ["portkit.autograd", "portkit.cache", "portkit.backends"],
    ["portkit.codegen"],
    ["portkit.reference_backends"],
    ["portkit.runtime"],
    ["portkit.schedule"],
    ["portkit.tensor"],
    ["portkit.jit"],
    ["portkit.nn", "portkit.optim", "portkit.amp"],
    ["portkit.onnx", "portkit.distributed"],
    ["portkit.conformance", "portkit.scaffold", "portkit.docs", "portkit.cli", "portkit"],
]
__doc__ += "\n".join("  " + ", ".join(layer) for layer in LAYERS)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    """The layer of `module`: that of the longest layer name it starts with."""
    best, found = -1, None
    for number, layer in enumerate(LAYERS):
        for name in layer:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), number
    assert found is not None, f"{module} is in no layer: add it to LAYERS"
    return found


def _imports(path: Path, module: str) -> set[str]:
    """The portkit modules `path` imports, outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name == "portkit" or name.startswith("portkit.")}


def _is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "{{" in str(path):
            continue
        module = _module(path)
        graph[module] = {m for m in _imports(path, module) if m != module}
    return graph


def test_every_import_points_down_the_layers():
    upward = [f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
              for module, targets in _graph().items() for target in sorted(targets)
              if _layer(target) > _layer(module)]
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_its_way_back_to_itself():
    graph = _graph()
    # a package's __init__ re-exports its modules; a module importing a sibling through the
    # package (`from portkit.tensor import Tensor`) is read as importing that sibling's package
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_module_sizes_are_reported(capsys):
    """Modules stay small by design (a module does one job); their sizes are shown, not capped."""
    sizes = sorted(((len(p.read_text().splitlines()), str(p.relative_to(ROOT)))
                    for p in PACKAGE.rglob("*.py")), reverse=True)
    with capsys.disabled():
        print("\nlargest modules: " + ", ".join(f"{path} {lines}" for lines, path in sizes[:8]))
    assert sizes


def test_the_layer_checker_sees_an_upward_import_and_a_cycle():
    graph = {"portkit.abi.ops": {"portkit.tensor.core"}, "portkit.tensor.core": {"portkit.abi.ops"}}
    assert _layer("portkit.tensor.core") > _layer("portkit.abi.ops")
    assert _cycles(graph) == [["portkit.abi.ops", "portkit.tensor.core"]]
    assert _layer("portkit.schedule.runner") == _layer("portkit.schedule")
