"""The device: the interpreter in this process, which needs nothing installed."""
from __future__ import annotations

from portkit.abi.backend import Device
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.reference_backends.interpreter.renderer import InterpreterRenderer
from portkit.reference_backends.interpreter.runtime import (
    InterpreterAllocator,
    InterpreterCompiler,
    InterpreterProgram,
)


def find_device() -> None:
    """Nothing to find: numpy is the device."""


def load() -> Device:
    """The interpreter as a Device."""
    find_device()
    return Device("interpreter", capabilities(), InterpreterAllocator(), InterpreterRenderer(),
                  InterpreterCompiler(), InterpreterProgram)
