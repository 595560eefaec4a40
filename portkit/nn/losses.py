"""The loss modules of torch.nn: each holds its options (and class weights, which state_dict
lists, as torch's buffers) and calls portkit.nn.functional's loss."""
from __future__ import annotations

from portkit.nn import functional as F
from portkit.nn.containers import functional_module
from portkit.nn.module import Module
from portkit.tensor import Tensor
from portkit.tensor.losses import Reduction, legacy_reduction

MSELoss = functional_module("MSELoss", F.mse_loss)
L1Loss = functional_module("L1Loss", F.l1_loss)
SmoothL1Loss = functional_module("SmoothL1Loss", F.smooth_l1_loss)
HuberLoss = functional_module("HuberLoss", F.huber_loss)
KLDivLoss = functional_module("KLDivLoss", F.kl_div)
PoissonNLLLoss = functional_module("PoissonNLLLoss", F.poisson_nll_loss)
GaussianNLLLoss = functional_module("GaussianNLLLoss", F.gaussian_nll_loss)
SoftMarginLoss = functional_module("SoftMarginLoss", F.soft_margin_loss)
HingeEmbeddingLoss = functional_module("HingeEmbeddingLoss", F.hinge_embedding_loss)
MarginRankingLoss = functional_module("MarginRankingLoss", F.margin_ranking_loss)
CosineEmbeddingLoss = functional_module("CosineEmbeddingLoss", F.cosine_embedding_loss)
TripletMarginLoss = functional_module("TripletMarginLoss", F.triplet_margin_loss)


class _WeightedLoss(Module):
    """A loss with optional per-class (or per-element) weights, torch's reduction options and
    torch's deprecated size_average and reduce."""

    def __init__(self, weight: Tensor | None = None, size_average: bool | None = None,
                 reduce: bool | None = None, reduction: Reduction = "mean"):
        self.weight = weight
        self.reduction = legacy_reduction(size_average, reduce, reduction)

    def extra_repr(self) -> str:
        return "" if self.reduction == "mean" else f"reduction={self.reduction!r}"


class NLLLoss(_WeightedLoss):
    """F.nll_loss of log-probabilities (N, C, ...) and class indices (N, ...)."""

    def __init__(self, weight: Tensor | None = None, size_average: bool | None = None,
                 ignore_index: int = -100, reduce: bool | None = None,
                 reduction: Reduction = "mean"):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class CrossEntropyLoss(_WeightedLoss):
    """F.cross_entropy of logits (N, C, ...) and class indices or probabilities."""

    def __init__(self, weight: Tensor | None = None, size_average: bool | None = None,
                 ignore_index: int = -100, reduce: bool | None = None,
                 reduction: Reduction = "mean", label_smoothing: float = 0.0):
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)


class BCELoss(_WeightedLoss):
    """F.binary_cross_entropy of probabilities and targets in [0, 1]."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    """F.multilabel_soft_margin_loss of logits and 0/1 targets per class."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.multilabel_soft_margin_loss(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
    """F.binary_cross_entropy_with_logits, with an optional weight for positives per class."""

    def __init__(self, weight: Tensor | None = None, size_average: bool | None = None,
                 reduce: bool | None = None, reduction: Reduction = "mean",
                 pos_weight: Tensor | None = None):
        super().__init__(weight, size_average, reduce, reduction)
        self.pos_weight = pos_weight

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.binary_cross_entropy_with_logits(input, target, self.weight,
                                                  reduction=self.reduction,
                                                  pos_weight=self.pos_weight)


__all__ = ["BCELoss", "BCEWithLogitsLoss", "CosineEmbeddingLoss", "CrossEntropyLoss",
           "GaussianNLLLoss", "HingeEmbeddingLoss", "HuberLoss", "KLDivLoss", "L1Loss",
           "MSELoss", "MarginRankingLoss", "MultiLabelSoftMarginLoss", "NLLLoss",
           "PoissonNLLLoss", "SmoothL1Loss", "SoftMarginLoss", "TripletMarginLoss"]
