"""The scheduler: splits a lazy graph into kernels, and runs them.

- `fusion`: which nodes get a buffer (and so a kernel) of their own, and long reduces cut into
  stages (`stages`);
- `keys`: the structure of a kernel and of a whole graph, the keys of every cache above the
  runtime, with numbers as scalar arguments;
- `runner`: lowering and compiling each kernel once per structure, launching, and replaying a
  graph seen before;
- `replay`: the one replay engine, shared with portkit.jit, and the capture a jit records by;
- `search`: the tuner (PORTKIT_BEAM), which times a matmul's tilings on the device.

`kernels(outs)` returns the kernels `realize(outs)` launches, through the same schedule and the
same lowering, so fusion is testable.
"""
from portkit.codegen.lower import MAX_SCALARS
from portkit.schedule.fusion import ScheduleItem, create_schedule, schedule
from portkit.schedule.keys import Scalars, scalar_values, structure, structure_key, var_value
from portkit.schedule.replay import record, recording
from portkit.schedule.runner import kernels, lower_item, realize, upload

__all__ = ["MAX_SCALARS", "Scalars", "ScheduleItem", "create_schedule", "kernels", "lower_item",
           "realize", "record", "recording", "scalar_values", "schedule", "structure",
           "structure_key", "upload", "var_value"]
