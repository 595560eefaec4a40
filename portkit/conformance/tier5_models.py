"""Tier 5, models: an MLP training run, a small CNN and a transformer block agree with the CPU
reference in losses and outputs.

It needs the Tensor stack and portkit.nn; until they import, and until its cases are written
here, the tier reports itself as not run, with the reason, never as passed.
"""
from __future__ import annotations

import importlib

from portkit.conformance.case import Case, Context, TierNotRun

TIER = 5
NAME = "models"


def cases(ctx: Context) -> list[Case]:
    """The model cases; raises TierNotRun while the stack or its cases are missing."""
    for module in ("portkit.tensor", "portkit.nn"):
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise TierNotRun(f"needs {module}, which does not import here ({error})") from None
    raise TierNotRun("the Tensor stack exists, but no model cases are written in "
                     "portkit/conformance/tier5_models.py yet")
