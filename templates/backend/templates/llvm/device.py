"""The board: finds the {{ cookiecutter.name }} device and joins its parts into one portkit `Device`.

Starter: llvm. The "device" is the host CPU and LLVM (llvmlite) is the toolchain; without
llvmlite the backend is reported unavailable with the fix, not broken. Replace the target
machine with your chip's LLVM target and the Program with your driver's launch.
"""
from portkit.abi import Device
from {{ cookiecutter.__module }}.capabilities import capabilities
from {{ cookiecutter.__module }}.renderer import {{ cookiecutter.__title }}Renderer
from {{ cookiecutter.__module }}.runtime import (
    {{ cookiecutter.__title }}Allocator,
    {{ cookiecutter.__title }}Compiler,
    {{ cookiecutter.__title }}Program,
)


def load() -> Device:
    """The device, ready to use; BackendUnavailable (with the fix) without llvmlite."""
    compiler = {{ cookiecutter.__title }}Compiler()
    return Device("{{ cookiecutter.name }}", capabilities(compiler.cpu),
                  {{ cookiecutter.__title }}Allocator(), {{ cookiecutter.__title }}Renderer(),
                  compiler, {{ cookiecutter.__title }}Program)
