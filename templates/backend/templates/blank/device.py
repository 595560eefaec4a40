"""The board: finds the {{ cookiecutter.name }} device and joins its parts into one portkit `Device`.

Starter: blank. `load` already succeeds, so that `portkit conform` reaches each part and
reports, tier by tier, what is missing; every part raises NotImplementedError naming the
section of portkit's docs/porting.md to read. Once your driver is wired in, raise
BackendUnavailable (naming the fix) here when there is no device.
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
    """The device, ready to use; BackendUnavailable (with the fix) if it cannot run here."""
    return Device("{{ cookiecutter.name }}", capabilities(), {{ cookiecutter.__title }}Allocator(),
                  {{ cookiecutter.__title }}Renderer(), {{ cookiecutter.__title }}Compiler(),
                  {{ cookiecutter.__title }}Program)
