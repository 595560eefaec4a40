"""Vector norms and the distances torch.nn.functional builds on them: normalize (in
functional.py), cosine_similarity, pairwise_distance and pdist; and the bilinear form."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from portkit.tensor.autocast_mode import runs_in_float32
from portkit.tensor.broadcast import broadcast
from portkit.tensor.dtype import float_of
from portkit.tensor.movement import einsum

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor


def vector_norm(input: Tensor, p: float, dim: int, keepdim: bool = False) -> Tensor:
    """||x||_p over dim (p may be inf, or 0 for the count of nonzeros), with torch's gradient
    0 at the zero vector."""
    x = input.cast(float_of(input.dtype))
    magnitude = x.abs()
    if p == float("inf"):
        return magnitude.amax(dim, keepdim=keepdim)
    if p == 0:
        return (x != 0).cast(x.dtype).sum(dim, keepdim=keepdim)
    total = (magnitude ** p).sum(dim, keepdim=keepdim)
    value = total.detach() ** (1 / p)
    # the gradient of total ** (1/p) is inf * 0 at the zero vector
    return value._with_grad((total, (total == 0)._where(0.0, value / (p * total))))


@runs_in_float32
def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """sum(x1 * x2) / (max(||x1||, eps) * max(||x2||, eps)) over dim, broadcasting x1 and x2."""
    a, b = broadcast_pair(x1, x2, "cosine_similarity")
    a = a / vector_norm(a, 2, dim, keepdim=True).clip(min=eps)
    b = b / vector_norm(b, 2, dim, keepdim=True).clip(min=eps)
    return (a * b).sum(dim)


@runs_in_float32
def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    """||x1 - x2 + eps||_p over the last dim."""
    a, b = broadcast_pair(x1, x2, "pairwise_distance")
    return vector_norm(a - b + eps, p, -1, keepdim)


@runs_in_float32
def pdist(input: Tensor, p: float = 2) -> Tensor:
    """||row i - row j||_p of each pair i < j of the rows of an (N, M) input, in row-major
    order."""
    if input.ndim != 2:
        raise RuntimeError(f"pdist only supports 2D tensors, got: {input.ndim}D")
    n = input.shape[0]
    first, second = np.triu_indices(n, 1)
    pairs = type(input)(np.stack([first, second]).astype(np.int32), device=input.device)
    return vector_norm(input.index_select(0, pairs[0]) - input.index_select(0, pairs[1]), p, -1)


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None
             ) -> Tensor:
    """x1^T weight[o] x2 (+ bias[o]) for each output o, over the last dims of x1 and x2."""
    lead = input1.shape[:-1]
    out = einsum("bi,oij,bj->bo", input1.reshape(-1, input1.shape[-1]), weight,
                 input2.reshape(-1, input2.shape[-1]))
    out = out.reshape(*lead, weight.shape[0])
    return out if bias is None else out + bias


def broadcast_pair(x1: Tensor, x2: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """x1 and x2 broadcast to one shape; RuntimeError (torch's) where they have none."""
    try:
        return broadcast(x1, x2)
    except ValueError:
        raise RuntimeError(f"{name}: shapes {x1.shape} and {x2.shape} cannot be broadcast "
                           f"together") from None


__all__ = ["bilinear", "broadcast_pair", "cosine_similarity", "pairwise_distance", "pdist",
           "vector_norm"]
