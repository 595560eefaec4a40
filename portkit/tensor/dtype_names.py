"""`portkit.dtypes`: every dtype under PyTorch's names as well as numpy's, so code written
against torch (`dtype=torch.long`) ports by changing the module name.

A module of its own because PyTorch's names (float, int, bool, long) shadow Python's builtins.
"""
from portkit.tensor.dtype import (
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
)

bool = bool_
half, float, double = float16, float32, float64
short, int, long = int16, int32, int64

__all__ = ["bfloat16", "bool", "bool_", "double", "float", "float16", "float32", "float64",
           "half", "int", "int8", "int16", "int32", "int64", "long", "short", "uint8", "uint16",
           "uint32", "uint64"]
