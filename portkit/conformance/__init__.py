"""Conformance: does a backend do what the ABI says, how exactly, and how fast?

Tiers run bottom-up (runtime, ABI ops, kernels, Tensor ops, models, performance); a case whose
prerequisite failed is blocked, not failed. See docs/conformance.md and `portkit conform --help`.
"""
from portkit.conformance.case import Status
from portkit.conformance.runner import run
from portkit.conformance.suite import Options, Report
from portkit.conformance.target import Target

__all__ = ["Options", "Report", "Status", "Target", "run"]
