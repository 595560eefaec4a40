"""The training zoo's workloads, each once in torch and once in portkit with the same shapes and
parameter names, so `copy_weights` starts both from the same values: an MLP, a CIFAR-shaped
CNN, a CIFAR ResNet-18 with BatchNorm, a GPT-2-shaped decoder (causal
scaled_dot_product_attention, token and position embeddings, tied head) and an LSTM language
model. `workload(name, size)` gives a workload's shapes at "default", "quick" (a fast run) or
"tiny" (what tests/stack/test_train_zoo.py checks in seconds); `build(...)` gives a framework's
model, optimizer, batch and training step.

benchmarks/train_zoo.py times them; the torch ResNet blocks are the inference zoo's (zoo.py).
"""
from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import portkit
from portkit import nn as pnn
from portkit import optim as poptim
from portkit.nn import functional as PF
from portkit.tensor import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # beside this file; its torch ResNet blocks

tnn, TF = torch.nn, torch.nn.functional

WORKLOADS = ("mlp", "cnn", "resnet18", "gpt", "lstm")

# per workload: its shapes at "default" (the published or customary ones), "quick", "tiny"
SIZES: dict[str, dict[str, dict]] = {
    "mlp": {"default": {"dims": (784, 512, 512, 10), "batch": 64},
            "quick": {"dims": (784, 512, 512, 10), "batch": 64},
            "tiny": {"dims": (12, 16, 16, 5), "batch": 4}},
    "cnn": {"default": {"widths": (32, 64, 128), "image": 32, "classes": 10, "batch": 32},
            "quick": {"widths": (16, 32, 64), "image": 32, "classes": 10, "batch": 8},
            "tiny": {"widths": (4, 8, 8), "image": 8, "classes": 5, "batch": 2}},
    "resnet18": {
        "default": {"width": 64, "depths": (2, 2, 2, 2), "image": 32, "classes": 10, "batch": 32},
        "quick": {"width": 16, "depths": (2, 2, 2, 2), "image": 32, "classes": 10, "batch": 8},
        "tiny": {"width": 4, "depths": (1, 1, 1, 1), "image": 8, "classes": 5, "batch": 2}},
    "gpt": {
        "default": {"depth": 2, "dim": 256, "heads": 4, "seq": 128, "vocab": 2000, "batch": 8},
        "quick": {"depth": 2, "dim": 128, "heads": 4, "seq": 64, "vocab": 2000, "batch": 4},
        "tiny": {"depth": 1, "dim": 16, "heads": 2, "seq": 8, "vocab": 50, "batch": 2}},
    "lstm": {"default": {"vocab": 2000, "embed": 256, "hidden": 256, "seq": 35, "batch": 16},
             "quick": {"vocab": 2000, "embed": 128, "hidden": 128, "seq": 35, "batch": 8},
             "tiny": {"vocab": 50, "embed": 8, "hidden": 8, "seq": 2, "batch": 2}},
}

# per workload: the optimizer's class name (the same in torch.optim and portkit.optim) and
# its settings
OPTIMIZERS: dict[str, tuple[str, dict]] = {
    "mlp": ("SGD", {"lr": 0.01}),
    "cnn": ("Adam", {"lr": 1e-3}),
    "resnet18": ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4}),
    "gpt": ("AdamW", {"lr": 3e-4, "weight_decay": 0.1}),
    "lstm": ("SGD", {"lr": 0.5}),
}


def workload(name: str, size: str = "default") -> dict:
    """The shapes of workload `name` at `size` ("default", "quick", "tiny")."""
    if name not in SIZES:
        raise ValueError(f"no training workload {name!r}; pick one of {', '.join(WORKLOADS)}")
    return SIZES[name][size]


# -- models written once for either library's nn (torch.nn or portkit.nn) ---------------------

def mlp(nn, dims: tuple[int, ...]):
    """Linear layers with ReLU between them."""
    layers = []
    for cin, cout in itertools.pairwise(dims):
        layers += [nn.Linear(cin, cout), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def cnn(nn, widths: tuple[int, int, int], image: int, classes: int):
    """conv-conv-maxpool-conv-maxpool-linear, 3x3 convs padded to keep the size."""
    a, b, c = widths
    return nn.Sequential(nn.Conv2d(3, a, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(a, b, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(b, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(c * (image // 4) ** 2, classes))


# -- torch ----------------------------------------------------------------------------------------

def torch_resnet(width: int, depths: tuple[int, ...], classes: int, **_) -> tnn.Module:
    """CIFAR ResNet-18: a 3x3 stem, no max pool, four stages of basic blocks (zoo.Basic)."""
    layers: list[tnn.Module] = [zoo.conv_bn(3, width, 3)]
    cin = width
    for stage, depth in enumerate(depths):
        for i in range(depth):
            layers.append(zoo.Basic(cin, width * 2 ** stage, 2 if i == 0 and stage else 1))
            cin = width * 2 ** stage
    return tnn.Sequential(*layers, tnn.AdaptiveAvgPool2d(1), tnn.Flatten(),
                          tnn.Linear(cin, classes))


class TorchBlock(tnn.Module):
    """A pre-norm GPT-2 block: causal attention through scaled_dot_product_attention, then a
    GELU MLP, each added back."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = tnn.LayerNorm(dim), tnn.LayerNorm(dim)
        self.qkv, self.proj = tnn.Linear(dim, 3 * dim), tnn.Linear(dim, dim)
        self.mlp = tnn.Sequential(tnn.Linear(dim, 4 * dim), tnn.GELU(), tnn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).chunk(3, -1))
        y = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TorchGPT(tnn.Module):
    """Token and position embeddings, blocks, a final LayerNorm, the token table as the head."""

    def __init__(self, depth: int, dim: int, heads: int, seq: int, vocab: int, **_):
        super().__init__()
        self.tokens, self.positions = tnn.Embedding(vocab, dim), tnn.Embedding(seq, dim)
        self.blocks = tnn.ModuleList(TorchBlock(dim, heads) for _ in range(depth))
        self.norm = tnn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions.weight
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.T


class TorchLSTM(tnn.Module):
    """An embedding, one LSTM layer, a linear head over the vocabulary at every step."""

    def __init__(self, vocab: int, embed: int, hidden: int, **_):
        super().__init__()
        self.tokens = tnn.Embedding(vocab, embed)
        self.rnn = tnn.LSTM(embed, hidden, batch_first=True)
        self.head = tnn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.tokens(ids))[0])


# -- portkit --------------------------------------------------------------------------------------

class GlobalAvgPool(pnn.Module):
    """The mean over H and W, kept as 1x1 (torch.nn.AdaptiveAvgPool2d(1))."""

    def forward(self, x: Tensor) -> Tensor:
        return x.mean((2, 3), keepdim=True)


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> pnn.Sequential:
    """Conv (no bias), BatchNorm, then ReLU when `relu` (zoo.conv_bn's layout)."""
    layers = [pnn.Conv2d(cin, cout, k, stride, k // 2, bias=False), pnn.BatchNorm2d(cout)]
    return pnn.Sequential(*layers, *([pnn.ReLU()] if relu else []))


class Basic(pnn.Module):
    """ResNet-18's block (zoo.Basic): two 3x3 convs and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int):
        self.body = pnn.Sequential(conv_bn(cin, cout, 3, stride), conv_bn(cout, cout, 3,
                                                                          relu=False))
        self.skip = (conv_bn(cin, cout, 1, stride, relu=False) if stride != 1 or cin != cout
                     else None)

    def forward(self, x: Tensor) -> Tensor:
        return (self.body(x) + (x if self.skip is None else self.skip(x))).relu()


def portkit_resnet(width: int, depths: tuple[int, ...], classes: int, **_) -> pnn.Module:
    """torch_resnet's network in portkit."""
    layers: list[pnn.Module] = [conv_bn(3, width, 3)]
    cin = width
    for stage, depth in enumerate(depths):
        for i in range(depth):
            layers.append(Basic(cin, width * 2 ** stage, 2 if i == 0 and stage else 1))
            cin = width * 2 ** stage
    return pnn.Sequential(*layers, GlobalAvgPool(), pnn.Flatten(), pnn.Linear(cin, classes))


class Block(pnn.Module):
    """TorchBlock in portkit."""

    def __init__(self, dim: int, heads: int):
        self.heads = heads
        self.norm1, self.norm2 = pnn.LayerNorm(dim), pnn.LayerNorm(dim)
        self.qkv, self.proj = pnn.Linear(dim, 3 * dim), pnn.Linear(dim, dim)
        self.mlp = pnn.Sequential(pnn.Linear(dim, 4 * dim), pnn.GELU(), pnn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).chunk(3, -1))
        y = PF.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class GPT(pnn.Module):
    """TorchGPT in portkit."""

    def __init__(self, depth: int, dim: int, heads: int, seq: int, vocab: int, **_):
        self.tokens, self.positions = pnn.Embedding(vocab, dim), pnn.Embedding(seq, dim)
        self.blocks = pnn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = pnn.LayerNorm(dim)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.tokens(ids) + self.positions.weight
        for block in self.blocks:
            x = block(x)
        return self.norm(x).matmul(self.tokens.weight.transpose(0, 1))


class LSTMLayer(pnn.Module):
    """One batch-first LSTM layer with torch.nn.LSTM's parameters (gates i, f, g, o), written
    out step by step: the input's share of every step's gates is one matmul up front."""

    def __init__(self, features: int, hidden: int):
        bound = 1 / math.sqrt(hidden)
        self.hidden = hidden
        self.weight_ih_l0 = pnn.uniform_parameter((4 * hidden, features), bound)
        self.weight_hh_l0 = pnn.uniform_parameter((4 * hidden, hidden), bound)
        self.bias_ih_l0 = pnn.uniform_parameter((4 * hidden,), bound)
        self.bias_hh_l0 = pnn.uniform_parameter((4 * hidden,), bound)

    def forward(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        gates_in = PF.linear(x, self.weight_ih_l0, self.bias_ih_l0 + self.bias_hh_l0)
        h = c = Tensor.zeros(b, self.hidden, device=x.device)
        outputs = []
        for step in range(t):
            gates = gates_in[:, step] + PF.linear(h, self.weight_hh_l0)
            # one sigmoid over all four gates (g's share unused): one copy of its formula
            i, f, _, o = gates.sigmoid().chunk(4, -1)
            c = f * c + i * gates.chunk(4, -1)[2].tanh()
            h = o * c.tanh()
            outputs.append(h)
        return portkit.stack(outputs, 1)


class LSTM(pnn.Module):
    """TorchLSTM in portkit."""

    def __init__(self, vocab: int, embed: int, hidden: int, **_):
        self.tokens = pnn.Embedding(vocab, embed)
        self.rnn = LSTMLayer(embed, hidden)
        self.head = pnn.Linear(hidden, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.rnn(self.tokens(ids)))


# -- a framework's model, optimizer, batch and step -------------------------------------------

@dataclass
class Training:
    """One framework's workload: `step()` runs one training step and returns its loss (lazy
    for portkit; call .item() to wait for it)."""

    model: object
    optimizer: object
    step: Callable[[], object]
    jitted: object = None       # the portkit.jit function, whose `plan` says it replays


def torch_model(name: str, shapes: dict) -> tnn.Module:
    """Workload `name`'s torch model, seeded (its weights are the ones portkit copies)."""
    torch.manual_seed(0)
    if name == "mlp":
        return mlp(tnn, shapes["dims"])
    if name == "cnn":
        return cnn(tnn, shapes["widths"], shapes["image"], shapes["classes"])
    return {"resnet18": torch_resnet, "gpt": TorchGPT, "lstm": TorchLSTM}[name](**shapes)


def portkit_model(name: str, shapes: dict) -> pnn.Module:
    """Workload `name`'s portkit model (random weights: copy torch's in with copy_weights)."""
    if name == "mlp":
        return mlp(pnn, shapes["dims"])
    if name == "cnn":
        return cnn(pnn, shapes["widths"], shapes["image"], shapes["classes"])
    return {"resnet18": portkit_resnet, "gpt": GPT, "lstm": LSTM}[name](**shapes)


def copy_weights(source: tnn.Module, target: pnn.Module) -> None:
    """torch's parameters and buffers into portkit's tensors of the same names (torch's
    BatchNorm batch counter has no portkit counterpart)."""
    state = {k: v.detach().numpy() for k, v in source.state_dict().items()
             if not k.endswith("num_batches_tracked")}
    target.load_state_dict(state)


def batch(name: str, shapes: dict) -> tuple[np.ndarray, np.ndarray]:
    """A fixed batch: inputs (images, features or token ids) and class or next-token targets."""
    rng = np.random.default_rng(1)
    n = shapes["batch"]
    if name in ("gpt", "lstm"):
        ids = rng.integers(0, shapes["vocab"], (n, shapes["seq"] + 1))
        return ids[:, :-1], ids[:, 1:]
    if name == "mlp":
        return rng.standard_normal((n, shapes["dims"][0]), np.float32), \
            rng.integers(0, shapes["dims"][-1], n)
    side = shapes["image"]
    return rng.standard_normal((n, 3, side, side), np.float32), \
        rng.integers(0, shapes["classes"], n)


def build_torch(name: str, shapes: dict, model: tnn.Module | None = None) -> Training:
    """torch's training step for workload `name` (on `model`, default a new seeded one)."""
    model = torch_model(name, shapes) if model is None else model
    model.train()
    kind, settings = OPTIMIZERS[name]
    opt = getattr(torch.optim, kind)(model.parameters(), **settings)
    x, y = (torch.from_numpy(a) for a in batch(name, shapes))

    def step() -> torch.Tensor:
        opt.zero_grad()
        logits = model(x)
        loss = TF.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss
    return Training(model, opt, step)


def build_portkit(name: str, shapes: dict, device: str = "cpu", jit: bool = False,
                  source: tnn.Module | None = None) -> Training:
    """portkit's training step for workload `name` on `device`, from `source`'s weights
    (default: a new seeded torch model's), run eagerly or through portkit.jit."""
    model = portkit_model(name, shapes)
    copy_weights(torch_model(name, shapes) if source is None else source, model)
    model.to(device)
    kind, settings = OPTIMIZERS[name]
    opt = getattr(poptim, kind)(model.parameters(), **settings)
    inputs, targets = batch(name, shapes)
    x = Tensor(inputs if inputs.dtype == np.float32 else inputs.astype(np.int32), device=device)
    y = Tensor(targets.astype(np.int32), device=device)

    def train(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        logits = model(x)
        loss = logits.reshape(-1, logits.shape[-1]).cross_entropy(y.reshape(-1))
        loss.backward()
        opt.step()
        return loss
    train = portkit.jit(train) if jit else train
    return Training(model, opt, lambda: train(x, y), train if jit else None)
