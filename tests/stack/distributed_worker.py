"""One rank of data-parallel training across processes, launched by torchrun:

    torchrun --standalone --nproc-per-node 2 tests/stack/distributed_worker.py STATE OUT STEPS

Rank 0 starts from the weights in STATE (an .npz); the other ranks start from zeros until
`broadcast_parameters` gives them rank 0's. Each rank trains on its share of the batch of
tests/stack/test_distributed.py and writes its final weights and losses to OUT/rank{r}.npz.
"""
import sys

import numpy as np
import torch.distributed as dist
from test_distributed import LR, MOMENTUM, X, Y, mlp, mse

from portkit import Tensor, distributed, optim


def main(state_path: str, out: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = mlp()
    if rank == 0:
        model.load_state_dict(dict(np.load(state_path)))
    else:
        for tensor in model.state_dict().values():
            tensor.assign(np.zeros(tensor.shape, np.float32))
    reducer = distributed.ProcessGroupReducer(model)
    reducer.broadcast_parameters()
    opt = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    share = len(X) // world
    xs = Tensor(X[rank * share:(rank + 1) * share])
    ys = Tensor(Y[rank * share:(rank + 1) * share])
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = mse(model(xs), ys)
        loss.backward()
        reducer.all_reduce_gradients()
        opt.step()
        losses.append(loss.item())
    state = {name: t.numpy() for name, t in model.state_dict().items()}
    np.savez(f"{out}/rank{rank}.npz", losses=np.array(losses), **state)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
