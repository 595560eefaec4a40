"""The board: finds the {{ cookiecutter.name }} device and joins its parts into one portkit `Device`.

Starter: the "device" is this computer's CPU and its C compiler, so the backend runs (and passes
`portkit conform`) before your hardware does. On your chip, `load` opens the driver, picks a
device, and raises BackendUnavailable, naming the fix, when there is none here.
"""
from portkit.abi import Device

from {{ cookiecutter.__module }}.capabilities import capabilities
from {{ cookiecutter.__module }}.renderer import {{ cookiecutter.__title }}Renderer
from {{ cookiecutter.__module }}.runtime import (
    {{ cookiecutter.__title }}Allocator,
    {{ cookiecutter.__title }}Compiler,
    {{ cookiecutter.__title }}Program,
    find_compiler,
)


def load() -> Device:
    """The device, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    compiler = {{ cookiecutter.__title }}Compiler(find_compiler())
    return Device("{{ cookiecutter.name }}", capabilities(f"host CPU ({compiler.version})"),
                  {{ cookiecutter.__title }}Allocator(), {{ cookiecutter.__title }}Renderer(), compiler,
                  {{ cookiecutter.__title }}Program)
