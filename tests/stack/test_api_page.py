"""docs/tensor-api.md, the Tensor API against PyTorch's, is generated from the code here: this
test fails when the page and the code disagree. Rewrite it with
`PORTKIT_WRITE_API_PAGE=1 pytest tests/stack/test_api_page.py`."""
import os
from pathlib import Path

import portkit
from portkit import amp, nn
from portkit.nn import functional as F
from portkit.optim import lr_scheduler
from portkit.tensor import Tensor

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tensor-api.md"


def _words(text: str) -> list[str]:
    return text.split()


# PyTorch names a user porting code reaches for, by where PyTorch has them
TENSOR_METHODS = _words("""abs acos acosh add all amax amin any argmax argmin argsort asin asinh
atan atan2 atanh bitwise_and bitwise_not bitwise_or bitwise_xor chunk clamp clip contiguous
copysign cos cosh cummax cummin cumprod cumsum detach diag diagonal div dot exp exp2 expand
flatten flip float floor fmod gather index_select int isclose isfinite isinf isnan item lerp log
log10 log1p log2 logaddexp logcumsumexp logical_and logical_not logical_or logical_xor logsumexp
masked_fill masked_select matmul max maximum mean min minimum mul neg nonzero numel numpy
permute pow prod reciprocal relu repeat repeat_interleave reshape roll round rsqrt scatter
scatter_reduce sigmoid sign sin sinh softmax sort split sqrt squeeze std sum take_along_dim tan
tanh tolist topk transpose tril triu trunc unflatten unfold unique unsqueeze var view where""")
FUNCTIONS = _words("""adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d
adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d avg_pool1d avg_pool2d avg_pool3d
batch_norm bilinear binary_cross_entropy binary_cross_entropy_with_logits celu channel_shuffle
conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d cosine_embedding_loss
cosine_similarity cross_entropy dropout dropout1d dropout2d dropout3d elu embedding
gaussian_nll_loss gelu glu grid_sample group_norm hardshrink hardsigmoid hardswish hardtanh
hinge_embedding_loss huber_loss instance_norm interpolate kl_div l1_loss layer_norm leaky_relu
linear local_response_norm log_softmax logsigmoid lp_pool1d lp_pool2d lp_pool3d
margin_ranking_loss max_pool1d max_pool2d max_pool3d max_unpool2d mish mse_loss
multilabel_soft_margin_loss nll_loss normalize one_hot pad pairwise_distance pdist pixel_shuffle
pixel_unshuffle poisson_nll_loss prelu relu relu6 rms_norm scaled_dot_product_attention selu
sigmoid silu smooth_l1_loss soft_margin_loss softmax softmin softplus softshrink softsign tanh
tanhshrink threshold triplet_margin_loss""")
TOP_LEVEL = _words("cat stack einsum meshgrid from_dlpack no_grad autocast")
AMP = _words("GradScaler")
MODULES = _words("""AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d AdaptiveMaxPool1d
AdaptiveMaxPool2d AdaptiveMaxPool3d AvgPool1d AvgPool2d AvgPool3d BCELoss BCEWithLogitsLoss
BatchNorm1d BatchNorm2d BatchNorm3d Bilinear CELU ChannelShuffle CircularPad1d CircularPad2d
CircularPad3d ConstantPad1d ConstantPad2d ConstantPad3d Conv1d Conv2d Conv3d ConvTranspose1d
ConvTranspose2d ConvTranspose3d CosineEmbeddingLoss CosineSimilarity CrossEntropyLoss Dropout
Dropout1d Dropout2d Dropout3d ELU Embedding Flatten GELU GLU GRU GaussianNLLLoss GroupNorm
Hardshrink Hardsigmoid Hardswish Hardtanh HingeEmbeddingLoss HuberLoss Identity InstanceNorm1d
InstanceNorm2d InstanceNorm3d KLDivLoss L1Loss LPPool1d LPPool2d LPPool3d LSTM LayerNorm LeakyReLU
Linear LocalResponseNorm LogSigmoid LogSoftmax MSELoss MarginRankingLoss MaxPool1d MaxPool2d
MaxPool3d Mish ModuleDict ModuleList MultiLabelSoftMarginLoss MultiheadAttention NLLLoss PReLU
PairwiseDistance ParameterDict ParameterList PixelShuffle PixelUnshuffle PoissonNLLLoss RMSNorm
RNN ReLU ReLU6 ReflectionPad1d ReflectionPad2d ReflectionPad3d ReplicationPad1d ReplicationPad2d
ReplicationPad3d SELU Sequential SiLU Sigmoid SmoothL1Loss SoftMarginLoss Softmax Softmin Softplus
Softshrink Softsign Tanh Tanhshrink Threshold TransformerEncoder TransformerEncoderLayer
TripletMarginLoss Unflatten Upsample UpsamplingBilinear2d UpsamplingNearest2d ZeroPad1d ZeroPad2d
ZeroPad3d""")
SCHEDULERS = _words("""StepLR MultiStepLR ExponentialLR CosineAnnealingLR LambdaLR LinearLR
OneCycleLR ReduceLROnPlateau""")

# where portkit has the name but differs from PyTorch: what differs
PARTLY = {
    "Tensor.max": "a tuple of dims gives amax's values (torch refuses it)",
    "Tensor.min": "a tuple of dims gives amin's values (torch refuses it)",
    "Tensor.sort": "O(n^2) pairwise ranking along the dim (no sort in the ABI); always stable",
    "Tensor.repeat_interleave": "integer repeats only, not a tensor of repeats",
    "Tensor.matmul": "operands of two dtypes promote as elementwise ops do (torch raises)",
    "nn.Linear": "an integer input promotes to the weight's float dtype (torch raises)",
    "Tensor.nonzero": "reads the values back to the host; int32 indices (torch: int64)",
    "Tensor.unique": "reads the values back to the host; sorted always; int32 inverse, counts",
    "F.embedding": "padding_idx only: no max_norm, scale_grad_by_freq or sparse",
    "F.dropout": "training defaults to Tensor.training, not True",
    "F.one_hot": "int32 result (torch: int64)",
    "F.interpolate": "nearest and (bi/tri)linear modes; no bicubic, area or antialias",
    "F.grid_sample": "4-d input; bilinear and nearest; zeros and border padding",
    "F.pad": "reflect, replicate and circular pad any trailing dims, sizes >= 0",
    "F.dropout1d": "training defaults to Tensor.training, not True",
    "F.dropout2d": "training defaults to Tensor.training, not True",
    "F.dropout3d": "training defaults to Tensor.training, not True",
    "F.relu": "inplace=True (here and in each activation) returns a new tensor; x is unchanged",
    "F.adaptive_max_pool1d": "return_indices only where the output size divides the input's",
    "F.adaptive_max_pool2d": "return_indices only where the output size divides the input's",
    "F.adaptive_max_pool3d": "return_indices only where the output size divides the input's",
    "nn.ReLU": "inplace=True (here and in each activation) returns a new tensor; x is unchanged",
    "nn.LSTM": "no proj_size",
    "nn.TransformerEncoderLayer": "bias=False is not supported",
    "nn.MultiheadAttention": "key and value of embed_dim features; no add_bias_kv, add_zero_attn",
    "nn.InstanceNorm1d": "no num_batches_tracked in the state dict (as portkit's BatchNorm)",
    "nn.InstanceNorm2d": "no num_batches_tracked in the state dict (as portkit's BatchNorm)",
    "nn.InstanceNorm3d": "no num_batches_tracked in the state dict (as portkit's BatchNorm)",
    "portkit.einsum": "distinct letters per operand, no '...' or diagonals",
    "portkit.from_dlpack": ("shares C-contiguous host memory on cpu/interpreter (so do "
                            "exports); copies on device backends"),
    "portkit.autocast": ("softmax, norms and sums run in float32 on every device (torch's CUDA "
                         "list; its CPU one keeps them 16-bit): docs/mixed-precision.md"),
    "amp.GradScaler": "the scale is a Python float; not under portkit.jit",
}
ALIASES: dict[str, str] = {}


def _rows() -> list[tuple[str, str, str]]:
    places = [("Tensor", Tensor, TENSOR_METHODS), ("F", F, FUNCTIONS),
              ("portkit", portkit, TOP_LEVEL), ("nn", nn, MODULES),
              ("lr_scheduler", lr_scheduler, SCHEDULERS), ("amp", amp, AMP)]
    rows = []
    for prefix, owner, names in places:
        for name in names:
            key = f"{prefix}.{name}"
            found = hasattr(owner, ALIASES.get(key, name).split(".")[-1])
            status = "not yet" if not found else "partly" if key in PARTLY else "supported"
            rows.append((key, status, PARTLY.get(key, "")))
    return rows


def render() -> str:
    """The page's text, from what the code defines today."""
    rows = _rows()
    counts = {s: sum(1 for _, status, _ in rows if status == s)
              for s in ("supported", "partly", "not yet")}
    lines = ["# The Tensor API against PyTorch's", "",
             ("Generated by `tests/stack/test_api_page.py` from the code (a test fails when they "
              "disagree)."),
             ("Supported names are compared with PyTorch CPU on every backend in "
              "`tests/stack` (forward and, where differentiable, backward)."),
             ("Mixed precision (`portkit.autocast`, `portkit.amp.GradScaler`): "
              "[mixed-precision.md](mixed-precision.md)."), "",
             ", ".join(f"{n} {s}" for s, n in counts.items()), "",
             "| PyTorch name | portkit | difference |", "|---|---|---|"]
    lines += [f"| `{name}` | {status} | {note} |" for name, status, note in rows]
    return "\n".join(lines) + "\n"


def test_api_page_is_generated_from_the_code():
    text = render()
    if os.environ.get("PORTKIT_WRITE_API_PAGE"):
        PAGE.write_text(text)
    assert PAGE.read_text() == text, "docs/tensor-api.md is stale: rewrite it (see docstring)"


def test_every_partly_note_names_something_that_exists():
    statuses = {name: status for name, status, _ in _rows()}
    assert all(statuses.get(name) == "partly" for name in PARTLY), PARTLY.keys() - {
        n for n, s in statuses.items() if s == "partly"}
