"""The instruction set: how an ABI kernel becomes {{ cookiecutter.name }} source code.

portkit's C-style renderer (portkit.codegen.cstyle) writes the kernel body, one line per ABI
node, from a table of op -> expression and a few string knobs; this class sets the knobs for
plain C and wraps the body in a launcher. For a C-like language (OpenCL C, CUDA C, Metal, ...)
change the knobs; see portkit/reference_backends/*/renderer.py for each of them.
"""
from typing import ClassVar

from portkit.abi import Kernel
from portkit.codegen.cstyle import CStyleRenderer

_IDS = ("gid0", "gid1", "gid2", "lid0", "lid1", "lid2")   # workgroup id, thread id per axis

# The kernel body is one thread's work. `pk_launch`, the entry point runtime.py calls, runs
# every thread of every workgroup in turn: dims holds grid[3] then block[3].
{% raw -%}
_TEMPLATE = """\
#include <stdbool.h>
#include <stdint.h>
#include <tgmath.h>

static void {{ name }}({{ args | join(", ") }}) {
{% for line in body %}
{{ line }}
{% endfor %}
}

void pk_launch(void **buffers, const int32_t *scalars, const int32_t *dims) {
  for (int32_t gid2 = 0; gid2 < dims[2]; gid2++)
    for (int32_t gid1 = 0; gid1 < dims[1]; gid1++)
      for (int32_t gid0 = 0; gid0 < dims[0]; gid0++)
        for (int32_t lid2 = 0; lid2 < dims[5]; lid2++)
          for (int32_t lid1 = 0; lid1 < dims[4]; lid1++)
            for (int32_t lid0 = 0; lid0 < dims[3]; lid0++)
              {{ name }}({{ call | join(", ") }});
}
"""
{%- endraw %}


class {{ cookiecutter.__title }}Renderer(CStyleRenderer):
    """C11 for the host compiler: one function per thread plus the `pk_launch` loop."""

    workitem: ClassVar[dict[str, str]] = {"group": "gid{}", "local": "lid{}"}
    template = _TEMPLATE

    def render_args(self, kernel: Kernel) -> list[str]:
        return super().render_args(kernel) + [f"const int32_t {i}" for i in _IDS]

    def template_context(self, kernel: Kernel, body: list[str]) -> dict:
        # pk_launch passes the buffers and int32 scalars it received, then the thread's ids.
        buffers = [f"({self.storage_type(p.dtype)} *)buffers[{p.arg}]" for p in kernel.params]
        scalars = [f"scalars[{i}]" for i in range(len(kernel.vars))]
        return {**super().template_context(kernel, body), "call": buffers + scalars + list(_IDS)}
