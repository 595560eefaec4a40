"""Tier 4, Tensor ops forward and backward, on the backend against the CPU reference.

It needs the Tensor stack (portkit.tensor); until that is importable, and until its cases are
written here, the tier reports itself as not run, with the reason, never as passed.
"""
from __future__ import annotations

import importlib

from portkit.conformance.case import Case, Context, TierNotRun

TIER = 4
NAME = "tensor"


def cases(ctx: Context) -> list[Case]:
    """The Tensor-op cases; raises TierNotRun while the stack or its cases are missing."""
    try:
        importlib.import_module("portkit.tensor")
    except ImportError as error:
        raise TierNotRun(f"needs portkit.tensor, which does not import here ({error})") from None
    raise TierNotRun("portkit.tensor exists, but no Tensor-op cases are written in "
                     "portkit/conformance/tier4_tensor.py yet")
