"""What gather-style indexing costs: a gather with the device-side index check against one
without it (timed in turns), the read-back's look at the fault flag, and the embedding gradient
(a scatter-add) summed along chains of equal indices against a one-hot compare over the table.

    PYTHONPATH=. python benchmarks/gather_check.py --backend cpu
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

from benchmarks.bench import in_turns, median_seconds, timings
from portkit.tensor import Tensor, faults
from portkit.tensor.indexing import scatter_sum


def measure(device: str, vocab: int, width: int, count: int) -> None:
    """Prints the three figures for `device`."""
    rng = np.random.default_rng(0)
    table = Tensor(rng.standard_normal((vocab, width)).astype(np.float32), device=device)
    index = Tensor(rng.integers(0, vocab, (count, 1)).astype(np.int32), device=device)
    table, index = table.realize(), index.realize()

    def gather(check: bool):
        return lambda: table._gather(0, index, "gather", False, check).realize()
    ratio = in_turns(gather(False), gather(True))
    print(f"{device}: gather {count} x {width} rows of {vocab}: checked / unchecked {ratio:.3f}")
    flag = statistics.median(timings(lambda: faults.check(device), 9))
    print(f"{device}: a read-back's look at the fault flag {flag * 1e6:.1f} us")

    grad = Tensor(rng.standard_normal((count, width)).astype(np.float32), device=device)
    grad = grad.realize()
    every = Tensor.arange(vocab, device=device).reshape(vocab, 1, 1)
    one_hot = median_seconds(lambda: grad.unsqueeze(0).where(
        index.unsqueeze(0) == every, 0).sum(1).realize(), 3)
    chains = median_seconds(lambda: scatter_sum(grad, index, vocab).realize(), 3)
    print(f"{device}: embedding gradient {vocab} x {width}, {count} indices: one-hot "
          f"{one_hot * 1e3:.1f} ms, chains {chains * 1e3:.1f} ms ({one_hot / chains:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", default=None)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--count", type=int, default=1024)
    args = parser.parse_args()
    for device in args.backend or ["cpu"]:
        measure(device, args.vocab, args.width, args.count)


if __name__ == "__main__":
    main()
