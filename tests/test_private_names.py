"""No module reaches into another portkit module's private names (`module._name`)."""
from __future__ import annotations

import ast
from pathlib import Path

import portkit

ROOT = Path(portkit.__file__).parent


def _portkit_modules(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("portkit"):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names
                      if alias.name.startswith("portkit")}
    return names


def _reaches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    modules = _portkit_modules(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("portkit"):
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import "
                      f"{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_reads_another_modules_private_names():
    found = [hit for path in sorted(ROOT.rglob("*.py"))
             for hit in _reaches(path)]
    assert not found, "make these public, with a docstring:\n" + "\n".join(found)
