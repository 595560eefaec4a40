"""The renderer: a kernel's source is its JSON form, which the program reads back."""
from __future__ import annotations

from portkit.abi.backend import Renderer
from portkit.abi.kernel import Kernel


class InterpreterRenderer(Renderer):
    """Kernel -> its JSON (Kernel.to_json)."""

    def render(self, kernel: Kernel) -> str:
        return kernel.to_json()
