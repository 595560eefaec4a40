"""portkit: bring a new accelerator to a full deep-learning stack by implementing a small ABI.

A backend implements portkit.abi; portkit.backends finds the installed ones; `portkit backends`
and `portkit conform` tell you which work here and how well.
"""
__version__ = "0.1.0"

# Public names of the stack (Tensor and friends) are exported here once they exist; keep this
# module import-light, since every backend imports portkit.abi through it.
__all__ = ["__version__"]
