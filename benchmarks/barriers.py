"""Kernels with LOCAL memory and BARRIERs (a workgroup tree sum, a reverse through LOCAL) on the
backends named, beside numpy: median of `--repeat` launches after one warm-up, results checked.

    PYTHONPATH=. python benchmarks/barriers.py --backend cpu --backend opencl

On the CPU these run as threads-as-loops (portkit.codegen.loops); they ran as coroutines before.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from portkit import runtime
from portkit.abi import KernelBuilder
from portkit.conformance.case import Context
from portkit.conformance.tier3_kernels import local_reverse, local_tree_sum

SHAPES = ((256, 256), (4096, 16), (16, 1024))     # (workgroups, threads per workgroup)


def _scaled(kernel, groups: int):
    """The conformance kernel with `groups` workgroups (it indexes by group, so it scales)."""
    builder = KernelBuilder(f"{kernel.name}_{groups}", list(kernel.nodes))
    return builder.build(grid=(groups, 1, 1), block=kernel.block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", default=None)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    context = Context(capabilities=None)
    for name in args.backend or ["cpu"]:
        rt = runtime.get(name)
        for build in (local_tree_sum, local_reverse):
            for groups, block in SHAPES:
                kernel = _scaled(build(context, block).kernel, groups)
                dtype = kernel.params[0].dtype
                x = (np.arange(groups * block) % 1000).astype(dtype.np)
                sums = build is local_tree_sum
                out = np.zeros(groups if sums else groups * block, dtype.np)
                compiled = rt.compile(kernel)
                buffers = [rt.alloc(dtype, a.size).copyin(a) for a in (x, out)]
                times = []
                for _ in range(args.repeat + 1):
                    start = time.perf_counter()
                    rt.launch(compiled, buffers, wait=True)
                    times.append(time.perf_counter() - start)
                rows = x.reshape(groups, block)
                want = rows.sum(1, dtype=dtype.np) if sums else rows[:, ::-1].reshape(-1)
                np.testing.assert_array_equal(buffers[1].numpy(), want)
                start = time.perf_counter()
                rows.sum(1) if sums else rows[:, ::-1].copy()
                numpy = time.perf_counter() - start
                print(f"{name:8} {build.__name__:15} {groups:5} x {block:4}: "
                      f"{statistics.median(times[1:]) * 1e3:9.3f} ms (numpy {numpy * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
