"""The inference zoo's models, in plain torch (torchvision does not import beside this torch),
with random weights from a fixed seed: the shapes a vendor tries first. `build(name, size,
batch)` gives a model in eval mode and its example inputs at one of three sizes: "full" (the
published shapes), "small" (quarter widths, small images, short sequences: a quick run) and
"tiny" (what the tests export and check on every backend in seconds).

Nothing here imports portkit: benchmarks/models.py runs these through portkit.onnx, and
tests/onnx/test_zoo.py checks them on every backend.
"""
from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

F = nn.functional
Inputs = tuple[torch.Tensor, ...]


def _norm(bn: nn.BatchNorm2d) -> nn.BatchNorm2d:
    """Running statistics that are not the identity, so a wrong BatchNorm shows."""
    bn.running_mean.uniform_(-0.2, 0.2)
    bn.running_var.uniform_(0.5, 1.5)
    return bn


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
            act: Callable[[], nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """Conv (no bias), BatchNorm, then the activation (none if act is None)."""
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
              _norm(nn.BatchNorm2d(cout))]
    return nn.Sequential(*layers, *([act()] if act else []))


# -- ResNet ---------------------------------------------------------------------------------------

class Basic(nn.Module):
    """ResNet-18's block: two 3x3 convs and a shortcut (a strided 1x1 where the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3, act=None))
        self.skip = (conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout
                     else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 down, 3x3, 1x1 up (4x), and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        mid = cout // 4
        self.body = nn.Sequential(conv_bn(cin, mid, 1), conv_bn(mid, mid, 3, stride),
                                  conv_bn(mid, cout, 1, act=None))
        self.skip = (conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout
                     else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


def resnet(width: int, depths: tuple[int, ...], bottleneck: bool, classes: int) -> nn.Module:
    block, grow = (Bottleneck, 4) if bottleneck else (Basic, 1)
    layers: list[nn.Module] = [conv_bn(3, width, 7, 2), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, depth in enumerate(depths):
        cout = width * 2 ** stage * grow
        for i in range(depth):
            layers.append(block(cin, cout, 2 if i == 0 and stage else 1))
            cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


# -- MobileNetV3-small and EfficientNet-B0 -------------------------------------------------------

class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int, gate: Callable[[], nn.Module]):
        super().__init__()
        self.down, self.up = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)
        self.act, self.gate = (nn.ReLU() if gate is nn.Hardsigmoid else nn.SiLU()), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        return x * self.gate(self.up(self.act(self.down(s))))


class InvertedResidual(nn.Module):
    """Expand (1x1), depthwise kxk, squeeze-excite, project (1x1); a residual where it fits."""

    def __init__(self, cin: int, expand: int, cout: int, k: int, stride: int, se: bool,
                 act: Callable[[], nn.Module], gate: Callable[[], nn.Module]):
        super().__init__()
        layers = [conv_bn(cin, expand, 1, act=act)] if expand != cin else []
        layers.append(conv_bn(expand, expand, k, stride, groups=expand, act=act))
        if se:
            layers.append(SqueezeExcite(expand, max(8, expand // 4), gate))
        layers.append(conv_bn(expand, cout, 1, act=None))
        self.body, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


# (kernel, expanded, out, squeeze-excite, hardswish, stride), from the MobileNetV3 paper
_MOBILENET_V3_SMALL = [
    (3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2), (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1), (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1)]


def mobilenet_v3_small(scale: float, classes: int) -> nn.Module:
    def c(n: int) -> int:
        return max(8, int(n * scale) // 8 * 8)
    layers: list[nn.Module] = [conv_bn(3, c(16), 3, 2, act=nn.Hardswish)]
    cin = c(16)
    for k, expand, cout, se, hard, stride in _MOBILENET_V3_SMALL:
        layers.append(InvertedResidual(cin, c(expand), c(cout), k, stride, se,
                                       nn.Hardswish if hard else nn.ReLU, nn.Hardsigmoid))
        cin = c(cout)
    return nn.Sequential(*layers, conv_bn(cin, c(576), 1, act=nn.Hardswish),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c(576), c(1024)),
                         nn.Hardswish(), nn.Linear(c(1024), classes))


# (expansion, kernel, stride, out, repeats), from the EfficientNet paper (B0)
_EFFICIENTNET_B0 = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]


def efficientnet_b0(scale: float, repeats: int, classes: int) -> nn.Module:
    def c(n: int) -> int:
        return max(8, int(n * scale) // 8 * 8)
    layers: list[nn.Module] = [conv_bn(3, c(32), 3, 2, act=nn.SiLU)]
    cin = c(32)
    for expansion, k, stride, cout, count in _EFFICIENTNET_B0:
        for i in range(min(count, repeats)):
            layers.append(InvertedResidual(cin, cin * expansion, c(cout), k,
                                           stride if i == 0 else 1, True, nn.SiLU, nn.Sigmoid))
            cin = c(cout)
    return nn.Sequential(*layers, conv_bn(cin, c(1280), 1, act=nn.SiLU),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c(1280), classes))


# -- ConvNeXt -------------------------------------------------------------------------------------

class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW map."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.scale = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dw(x).permute(0, 2, 3, 1))
        y = self.down(F.gelu(self.up(y))) * self.scale
        return x + y.permute(0, 3, 1, 2)


def convnext(dims: tuple[int, ...], depths: tuple[int, ...], classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), ChannelNorm(dims[0])]
    for stage, (dim, depth) in enumerate(zip(dims, depths)):
        if stage:
            layers += [ChannelNorm(dims[stage - 1]), nn.Conv2d(dims[stage - 1], dim, 2, 2)]
        layers += [ConvNeXtBlock(dim) for _ in range(depth)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(dims[-1]),
                         nn.Linear(dims[-1], classes))


# -- transformers ---------------------------------------------------------------------------------

class Attention(nn.Module):
    """Multi-head self-attention written out (matmul, softmax), with an additive mask and an
    optional key/value cache: the graph every exporter writes the same way."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                past: tuple[torch.Tensor, torch.Tensor] | None = None):
        b, t, dim = x.shape
        q, k, v = (z.reshape(b, t, self.heads, dim // self.heads).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, -1))
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(dim // self.heads)
        if mask is not None:
            scores = scores + mask
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, dim)
        return self.out(y), (k, v)


class Block(nn.Module):
    """A pre-norm transformer block (GPT-2, ViT) or, with post_norm, a BERT block."""

    def __init__(self, dim: int, heads: int, post_norm: bool = False):
        super().__init__()
        self.attn, self.post_norm = Attention(dim, heads), post_norm
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, past=None):
        if self.post_norm:
            y, cache = self.attn(x, mask, past)
            x = self.norm1(x + y)
            return self.norm2(x + self.mlp(x)), cache
        y, cache = self.attn(self.norm1(x), mask, past)
        x = x + y
        return x + self.mlp(self.norm2(x)), cache


class ViT(nn.Module):
    def __init__(self, image: int, patch: int, dim: int, depth: int, heads: int, classes: int):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.patch(image).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for block in self.blocks:
            x, _ = block(x)
        return self.head(self.norm(x[:, 0]))


class Bert(nn.Module):
    """A BERT-shaped encoder: token and position embeddings, post-norm blocks, a padding mask
    (1 for a token, 0 for padding) turned into an additive one; the pooled first token out."""

    def __init__(self, vocab: int, length: int, dim: int, depth: int, heads: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(length, dim)
        self.norm = nn.LayerNorm(dim)
        self.blocks = nn.ModuleList(Block(dim, heads, post_norm=True) for _ in range(depth))
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.tokens(ids) + self.positions.weight[:ids.shape[1]])
        additive = (1.0 - mask[:, None, None, :].float()) * -10000.0
        for block in self.blocks:
            x, _ = block(x, additive)
        return torch.tanh(self.pool(x[:, 0]))


class GPT(nn.Module):
    """A GPT-2-shaped decoder. Prefill: logits of every position and the key/value cache.
    Decode (`past` given): one new token's logits and the cache grown by one position; the
    cache is one tensor (layers, 2, batch, heads, positions, head size)."""

    def __init__(self, vocab: int, length: int, dim: int, depth: int, heads: int):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(length, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor, past: torch.Tensor | None = None):
        start = 0 if past is None else past.shape[4]
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions.weight[start:start + t]
        causal = torch.full((t, start + t), -10000.0, device=ids.device).triu(start + 1)
        caches = []
        for layer, block in enumerate(self.blocks):
            x, (k, v) = block(x, causal, None if past is None else (past[layer, 0],
                                                                    past[layer, 1]))
            caches.append(torch.stack([k, v]))
        return self.norm(x) @ self.tokens.weight.T, torch.stack(caches)


class Decode(nn.Module):
    """One decode step of `gpt` as a model of its own (inputs: the token and the cache)."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt = gpt

    def forward(self, ids: torch.Tensor, past: torch.Tensor):
        return self.gpt(ids, past)


# -- recurrent, U-Net, detection ------------------------------------------------------------------

class Recurrent(nn.Module):
    """An LSTM or GRU over a sequence of features, classified from its last step."""

    def __init__(self, kind: str, features: int, hidden: int, layers: int, classes: int):
        super().__init__()
        self.rnn = getattr(nn, kind)(features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class UNet(nn.Module):
    """Three levels down (two conv-bn-relu, max pool) and up (transposed conv, concat)."""

    def __init__(self, width: int, levels: int = 3, classes: int = 2):
        super().__init__()
        chans = [width * 2 ** i for i in range(levels + 1)]
        self.down = nn.ModuleList(nn.Sequential(conv_bn(cin, cout, 3), conv_bn(cout, cout, 3))
                                  for cin, cout in zip([3, *chans[:-2]], chans[:-1]))
        self.middle = nn.Sequential(conv_bn(chans[-2], chans[-1], 3), conv_bn(chans[-1],
                                                                              chans[-1], 3))
        self.up = nn.ModuleList(nn.ConvTranspose2d(c * 2, c, 2, 2) for c in chans[-2::-1])
        self.merge = nn.ModuleList(nn.Sequential(conv_bn(c * 2, c, 3), conv_bn(c, c, 3))
                                   for c in chans[-2::-1])
        self.out = nn.Conv2d(chans[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for down in self.down:
            x = down(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.middle(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips)):
            x = merge(torch.cat([up(x), skip], 1))
        return self.out(x)


class DetectionHead(nn.Module):
    """A backbone's two feature maps merged FPN-style (bilinear Resize), per-anchor class
    scores and boxes, then the `top` best scores (TopK) and their boxes (GatherElements)."""

    def __init__(self, width: int, classes: int, anchors: int, top: int):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, width, 3, 2), conv_bn(width, width, 3, 2))
        self.deep = nn.Sequential(conv_bn(width, 2 * width, 3, 2), conv_bn(2 * width, width, 1))
        self.classes, self.top = classes, top
        self.scores = nn.Conv2d(width, anchors * classes, 3, padding=1)
        self.boxes = nn.Conv2d(width, anchors * 4, 3, padding=1)

    def forward(self, image: torch.Tensor):
        fine = self.stem(image)
        merged = fine + F.interpolate(self.deep(fine), size=fine.shape[2:], mode="bilinear",
                                      align_corners=False)
        b = image.shape[0]
        scores = self.scores(merged).permute(0, 2, 3, 1).reshape(b, -1, self.classes)
        boxes = self.boxes(merged).permute(0, 2, 3, 1).reshape(b, -1, 4)
        best, where = scores.sigmoid().max(-1).values.topk(self.top, -1)
        return best, boxes.gather(1, where[..., None].expand(-1, -1, 4))


# -- the zoo --------------------------------------------------------------------------------------

# per model: the full shape, then (small, tiny) overrides
def _sizes(size: str, full, small, tiny):
    return {"full": full, "small": small, "tiny": tiny}[size]


def build(name: str, size: str = "full", batch: int = 1) -> tuple[nn.Module, Inputs]:
    """Model `name` of the zoo at `size` ("full", "small", "tiny") in eval mode, seeded, and
    example inputs for `batch`."""
    torch.manual_seed(0)
    s = lambda full, small, tiny: _sizes(size, full, small, tiny)
    image = s(224, 112, 32)

    def pixels(side: int = image) -> Inputs:
        return (torch.randn(batch, 3, side, side),)

    if name in ("resnet18", "resnet50"):
        depths = (2, 2, 2, 2) if name == "resnet18" else (3, 4, 6, 3)
        model = resnet(s(64, 16, 8), depths, name == "resnet50", s(1000, 100, 10))
        inputs = pixels()
    elif name == "mobilenet_v3_small":
        model, inputs = mobilenet_v3_small(s(1.0, 0.5, 0.25), s(1000, 100, 10)), pixels()
    elif name == "efficientnet_b0":
        model = efficientnet_b0(s(1.0, 0.5, 0.25), s(4, 2, 1), s(1000, 100, 10))
        inputs = pixels()
    elif name == "convnext_tiny":
        model = convnext(s((96, 192, 384, 768), (32, 64, 128, 256), (8, 16, 16, 32)),
                         s((3, 3, 9, 3), (1, 1, 3, 1), (1, 1, 1, 1)), s(1000, 100, 10))
        inputs = pixels()
    elif name == "vit_s16":
        model = ViT(image, s(16, 16, 8), s(384, 96, 32), s(12, 4, 2), s(6, 3, 2),
                    s(1000, 100, 10))
        inputs = pixels()
    elif name == "bert_base":
        length, vocab = s(128, 64, 16), s(30522, 5000, 100)
        model = Bert(vocab, length, s(768, 192, 32), s(12, 4, 2), s(12, 4, 2))
        mask = torch.ones(batch, length, dtype=torch.int64)
        mask[:, length * 3 // 4:] = 0          # the last quarter is padding
        inputs = (torch.randint(0, vocab, (batch, length)), mask)
    elif name in ("gpt2_prefill", "gpt2_decode"):
        length, vocab, dim = s(128, 64, 16), s(50257, 5000, 100), s(768, 192, 32)
        depth, heads = s(12, 4, 2), s(12, 4, 2)
        model = GPT(vocab, length + 1, dim, depth, heads)
        if name == "gpt2_prefill":
            inputs = (torch.randint(0, vocab, (batch, length)),)
        else:
            model = Decode(model)
            past = torch.randn(depth, 2, batch, heads, length, dim // heads)
            inputs = (torch.randint(0, vocab, (batch, 1)), past)
    elif name in ("lstm", "gru", "lstm_200", "gru_200"):
        kind, _, steps = name.partition("_")
        features, length = s(64, 32, 8), s(int(steps or 50), 50, 6)
        model = Recurrent(kind.upper(), features, s(256, 64, 16), s(2, 1, 1), 10)
        inputs = (torch.randn(batch, length, features),)
    elif name == "unet":
        model, inputs = UNet(s(32, 16, 8)), pixels(s(128, 64, 32))
    elif name == "detection_head":
        model = DetectionHead(s(64, 32, 8), s(80, 20, 4), 3, s(100, 50, 10))
        inputs = pixels(s(256, 128, 32))
    else:
        raise ValueError(f"no zoo model {name!r}; pick one of {', '.join(MODELS + FULL_ONLY)}")
    return model.eval(), inputs


MODELS = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_s16",
          "bert_base", "gpt2_prefill", "gpt2_decode", "lstm", "gru", "unet", "detection_head")
# run with --full or by name (--models resnet50): ResNet-50, and the recurrent models over 200 steps
FULL_ONLY = ("resnet50", "lstm_200", "gru_200")


def export(model: nn.Module, inputs: Inputs, path: Path) -> None:
    """Writes `model` at `inputs` as ONNX to `path` with torch's (dynamo) exporter."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    program.save(str(partial))
    partial.replace(path)


def exported(name: str, size: str, batch: int, folder: Path
             ) -> tuple[nn.Module, Inputs, Path]:
    """Model `name`, its example inputs and the path of its ONNX export in `folder`, exported
    on first use; the file name holds a hash of this module, so a changed model re-exports."""
    model, inputs = build(name, size, batch)
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:10]
    path = folder / f"{name}-{size}-b{batch}-{digest}.onnx"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        export(model, inputs, path)
    return model, inputs, path
