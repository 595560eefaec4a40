"""torch.nn.functional's regression, divergence and margin losses (mse, l1, smooth_l1, huber,
kl_div, poisson and gaussian nll, the margin and embedding losses) and the `reduction=` every
loss shares; the cross entropies are in functional.py.

Each takes torch's legacy size_average= and reduce= too, read as torch reads them.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal, TypeVar

from portkit.tensor.autocast_mode import runs_in_float32
from portkit.tensor.distances import broadcast_pair, pairwise_distance

if TYPE_CHECKING:
    from portkit.tensor.core import Tensor

Reduction = Literal["mean", "sum", "none"]
R = TypeVar("R", bound=str)


def check_reduction(reduction: str) -> str:
    """reduction, if it is "mean", "sum" or "none" (else ValueError, as torch)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction: 'mean', 'sum' or "
                         f"'none'")
    return reduction


def reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    """The mean or sum of the elementwise loss, or the loss itself ("none")."""
    return {"mean": loss.mean, "sum": loss.sum,
            "none": lambda: loss}[check_reduction(reduction)]()


def legacy_reduction(size_average: bool | None, reduce: bool | None, reduction: R
                     ) -> R | Reduction:
    """reduction, or what torch's deprecated size_average and reduce name when either is set."""
    if size_average is None and reduce is None:
        return reduction
    if reduce is False:
        return "none"
    return "sum" if size_average is False else "mean"


def _weighted(loss: Tensor, weight: Tensor | None, reduction: str, mean_by_weight: bool
              ) -> Tensor:
    """loss * weight reduced; the mean divides by the weights' sum when mean_by_weight
    (torch's mse and l1), else by the count (its huber)."""
    if weight is None:
        return reduce_loss(loss, reduction)
    if weight.shape != loss.shape:
        raise ValueError("Weights and input must have the same size.")
    loss = loss * weight
    if reduction == "mean" and mean_by_weight:
        return loss.sum() / weight.sum()
    return reduce_loss(loss, reduction)


def _difference(input: Tensor, target: Tensor, name: str) -> Tensor:
    a, b = broadcast_pair(input, target, name)
    return a - b


@runs_in_float32
def mse_loss(input: Tensor, target: Tensor, size_average: bool | None = None,
             reduce: bool | None = None, reduction: Reduction = "mean",
             weight: Tensor | None = None) -> Tensor:
    """(input - target) ** 2, reduced."""
    d = _difference(input, target, "mse_loss")
    return _weighted(d * d, weight, legacy_reduction(size_average, reduce, reduction), True)


@runs_in_float32
def l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None,
            reduce: bool | None = None, reduction: Reduction = "mean",
            weight: Tensor | None = None) -> Tensor:
    """|input - target|, reduced."""
    d = _difference(input, target, "l1_loss")
    return _weighted(d.abs(), weight, legacy_reduction(size_average, reduce, reduction), True)


@runs_in_float32
def smooth_l1_loss(input: Tensor, target: Tensor, size_average: bool | None = None,
                   reduce: bool | None = None, reduction: Reduction = "mean",
                   beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta, of d = input - target; reduced."""
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    d = _difference(input, target, "smooth_l1_loss")
    a = d.abs()
    loss = a if beta == 0 else (a < beta)._where(d * d * (0.5 / beta), a - 0.5 * beta)
    return reduce_loss(loss, legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def huber_loss(input: Tensor, target: Tensor, reduction: Reduction = "mean",
               delta: float = 1.0, weight: Tensor | None = None) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), of d = input - target;
    reduced."""
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    d = _difference(input, target, "huber_loss")
    a = d.abs()
    loss = (a < delta)._where(d * d * 0.5, (a - 0.5 * delta) * delta)
    return _weighted(loss, weight, reduction, False)


@runs_in_float32
def kl_div(input: Tensor, target: Tensor, size_average: bool | None = None,
           reduce: bool | None = None, reduction: str = "mean", log_target: bool = False
           ) -> Tensor:
    """target * (log target - input) of log-probabilities `input` (0 where target is 0), or
    exp(target) * (target - input) when log_target; "batchmean" divides the sum by the batch
    size."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = target.exp() * (target - input)
    else:
        zero = target == 0      # log 1 in place of log 0 keeps -inf out of the gradient
        loss = zero._where(0.0, target * (zero._where(1.0, target).log() - input))
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return reduce_loss(loss, reduction)



@runs_in_float32
def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False,
                     size_average: bool | None = None, eps: float = 1e-8,
                     reduce: bool | None = None, reduction: Reduction = "mean") -> Tensor:
    """exp(input) - target * input (log_input), else input - target * log(input + eps); full
    adds Stirling's term where target > 1."""
    if log_input:
        loss = input.exp() - target * input
    else:
        loss = input - target * (input + eps).log()
    if full:
        big = target > 1
        t = big._where(target, 1.0)
        loss = loss + big._where(t * t.log() - t + 0.5 * (2 * math.pi * t).log(), 0.0)
    return reduce_loss(loss, legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def gaussian_nll_loss(input: Tensor, target: Tensor, var: Tensor | float, full: bool = False,
                      eps: float = 1e-6, reduction: Reduction = "mean") -> Tensor:
    """0.5 (log var + (input - target)^2 / var), var at least eps (its gradient as if it
    were not clamped, as torch's); full adds 0.5 log(2 pi)."""
    if isinstance(var, int | float):
        var = input.full_like(float(var))
    if var.shape != input.shape:
        if var.shape == input.shape[:-1]:
            var = var.unsqueeze(-1)
        elif not (var.shape[:-1] == input.shape[:-1] and var.shape[-1:] == (1,)):
            raise ValueError("var is of incorrect size")
    if var.lazy.realized and (var.numpy() < 0).any():
        raise ValueError("var has negative entry/entries")
    var = var + (var.clip(min=eps) - var).detach()
    d = input - target
    loss = 0.5 * (var.log() + d * d / var)
    return reduce_loss(loss + 0.5 * math.log(2 * math.pi) if full else loss, reduction)


@runs_in_float32
def soft_margin_loss(input: Tensor, target: Tensor, size_average: bool | None = None,
                     reduce: bool | None = None, reduction: Reduction = "mean") -> Tensor:
    """log(1 + exp(-target * input)) of targets 1 or -1."""
    return reduce_loss((-target * input).softplus(),
                       legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def hinge_embedding_loss(input: Tensor, target: Tensor, margin: float = 1.0,
                         size_average: bool | None = None, reduce: bool | None = None,
                         reduction: Reduction = "mean") -> Tensor:
    """input where target is not -1, plus max(0, margin - input) where target is not 1."""
    loss = (target != 1)._where((margin - input).clip(min=0), 0.0) + \
        (target != -1)._where(input, 0.0)
    return reduce_loss(loss, legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0,
                        size_average: bool | None = None, reduce: bool | None = None,
                        reduction: Reduction = "mean") -> Tensor:
    """max(0, -target * (input1 - input2) + margin)."""
    loss = (-target * (input1 - input2) + margin).clip(min=0)
    return reduce_loss(loss, legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0,
                          size_average: bool | None = None, reduce: bool | None = None,
                          reduction: Reduction = "mean") -> Tensor:
    """1 - cos(input1, input2) where target is 1, max(0, cos - margin) where it is -1; the
    cosine over the last dim with torch's 1e-12 added to each squared norm."""
    dot = (input1 * input2).sum(-1)
    cos = dot / (((input1 * input1).sum(-1) + 1e-12) * ((input2 * input2).sum(-1) + 1e-12)
                 ).sqrt()
    loss = (target == 1)._where(1 - cos, 0.0) + \
        (target == -1)._where((cos - margin).clip(min=0), 0.0)
    return reduce_loss(loss, legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor,
                        margin: float = 1.0, p: float = 2, eps: float = 1e-6,
                        swap: bool = False, size_average: bool | None = None,
                        reduce: bool | None = None, reduction: Reduction = "mean") -> Tensor:
    """max(0, margin + d(anchor, positive) - d(anchor, negative)) of pairwise distances;
    swap uses d(positive, negative) where it is smaller."""
    closer = pairwise_distance(anchor, positive, p, eps)
    farther = pairwise_distance(anchor, negative, p, eps)
    if swap:
        farther = farther.minimum(pairwise_distance(positive, negative, p, eps))
    loss = (margin + closer - farther).clip(min=0)
    return reduce_loss(loss, legacy_reduction(size_average, reduce, reduction))


@runs_in_float32
def multilabel_soft_margin_loss(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                size_average: bool | None = None, reduce: bool | None = None,
                                reduction: Reduction = "mean") -> Tensor:
    """-(y log sigmoid(x) + (1 - y) log sigmoid(-x)), weighted, averaged over the classes
    (the last dim)."""
    loss = target * (-input).softplus() + (1 - target) * input.softplus()
    loss = loss if weight is None else loss * weight
    return reduce_loss(loss.sum(-1) * (1 / input.shape[-1]),
                       legacy_reduction(size_average, reduce, reduction))

__all__ = ["check_reduction", "cosine_embedding_loss", "gaussian_nll_loss", "hinge_embedding_loss",
           "huber_loss", "kl_div", "l1_loss", "legacy_reduction", "margin_ranking_loss",
           "mse_loss", "multilabel_soft_margin_loss", "poisson_nll_loss", "reduce_loss",
           "smooth_l1_loss", "soft_margin_loss", "triplet_margin_loss"]
