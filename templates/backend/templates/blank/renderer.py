"""The instruction set: how an ABI kernel becomes {{ cookiecutter.name }} source code.

Starter: blank. Write `render`; docs/porting.md, "Tier 2: ops", walks through it. If your
language looks like C, subclass portkit.codegen.cstyle.CStyleRenderer instead and set its
knobs, as every reference backend does (portkit/reference_backends/*/renderer.py).
"""
from portkit.abi import Kernel, Renderer

GUIDE = "docs/porting.md in the portkit repository"


class {{ cookiecutter.__title }}Renderer(Renderer):
    """Kernel -> source text in the device's language."""

    def render(self, kernel: Kernel) -> str:
        raise NotImplementedError(
            f"{type(self).__name__}.render is not written yet: turn the ABI kernel (a list of "
            f"nodes, portkit/abi/kernel.py) into your language's source; read {GUIDE}, "
            "section 'Tier 2: ops'")
