"""torch.nn.functional's regression and divergence losses (mse, l1, smooth_l1, huber, kl_div)
and the `reduction=` every loss shares; the classification losses are in functional.py.

Each takes torch's legacy size_average= and reduce= too, read as torch reads them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypeVar

from portkit.tensor.autocast_mode import runs_in_float32
from portkit.tensor.distances import broadcast_pair

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


__all__ = ["check_reduction", "huber_loss", "kl_div", "l1_loss", "legacy_reduction", "mse_loss", "reduce_loss",
           "smooth_l1_loss"]
