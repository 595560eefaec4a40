"""The board: finds the {{ cookiecutter.name }} device and joins its parts into one portkit `Device`.

Starter: vulkan. The device is the system's first Vulkan device (lavapipe, Mesa's CPU Vulkan
driver, where no GPU is); without the `vulkan` binding, libvulkan or glslangValidator the
backend is reported unavailable with the fix, not broken. A pipeline's layout is built from
the kernel's Signature, so programs are made by `signed_program`.
"""
import functools

from portkit.abi import Device
from {{ cookiecutter.__module }}.capabilities import capabilities
from {{ cookiecutter.__module }}.renderer import {{ cookiecutter.__title }}Renderer
from {{ cookiecutter.__module }}.runtime import (
    {{ cookiecutter.__title }}Allocator,
    {{ cookiecutter.__title }}Compiler,
    {{ cookiecutter.__title }}Program,
    open_gpu,
)


def load() -> Device:
    """The device, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    gpu = open_gpu()
    program = functools.partial({{ cookiecutter.__title }}Program, gpu)
    return Device("{{ cookiecutter.name }}", capabilities(gpu.properties),
                  {{ cookiecutter.__title }}Allocator(gpu), {{ cookiecutter.__title }}Renderer(),
                  {{ cookiecutter.__title }}Compiler(), program, signed_program=program)
