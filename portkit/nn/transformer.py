"""torch.nn.TransformerEncoderLayer and TransformerEncoder: self-attention and a feed-forward
block, each with a residual connection and a layer norm (after it, or before with
norm_first), with torch's parameter names."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from portkit.nn import functional as F
from portkit.nn.attention import MultiheadAttention
from portkit.nn.containers import Dropout, ModuleList
from portkit.nn.layers import LayerNorm, Linear
from portkit.nn.module import Module
from portkit.tensor import Tensor

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(Module):
    """x + self-attention, then x + linear2(dropout(activation(linear1(x)))), each followed
    by a layer norm (or preceded, with norm_first), as torch's (bias=False is not
    supported)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str | Callable[[Tensor], Tensor] = "relu",
                 layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True):
        if not bias:
            raise NotImplementedError("TransformerEncoderLayer: bias=False is not supported")
        if isinstance(activation, str) and activation not in _ACTIVATIONS:
            raise RuntimeError(f"activation should be relu/gelu, not {activation}")
        self.arguments = (d_model, nhead, dim_feedforward, dropout, activation,
                          layer_norm_eps, batch_first, norm_first)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _ACTIVATIONS[activation] if isinstance(activation, str) else activation

    def forward(self, src: Tensor, src_mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None, is_causal: bool = False
                ) -> Tensor:
        """The layer's output, of src's shape."""
        def attend(x: Tensor) -> Tensor:
            out = self.self_attn(x, x, x, attn_mask=src_mask,
                                 key_padding_mask=src_key_padding_mask, need_weights=False,
                                 is_causal=is_causal)[0]
            return self.dropout1(out)

        def feed_forward(x: Tensor) -> Tensor:
            return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

        x = src
        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + feed_forward(self.norm2(x))
        x = self.norm1(x + attend(x))
        return self.norm2(x + feed_forward(x))


class TransformerEncoder(Module):
    """num_layers copies of encoder_layer (each starting from its values, as torch's deep
    copies), applied in turn, then the optional norm."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int,
                 norm: Module | None = None, enable_nested_tensor: bool = True,
                 mask_check: bool = True):
        values: dict[str, Tensor | np.ndarray] = dict(encoder_layer.state_dict())
        copies = []
        for _ in range(num_layers):
            layer = TransformerEncoderLayer(*encoder_layer.arguments)
            layer.load_state_dict(values)
            copies.append(layer)
        self.layers = ModuleList(copies)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Tensor, mask: Tensor | None = None,
                src_key_padding_mask: Tensor | None = None, is_causal: bool | None = None
                ) -> Tensor:
        """src through every layer, then the norm."""
        x = src
        for layer in self.layers:
            x = layer(x, mask, src_key_padding_mask, bool(is_causal))
        return x if self.norm is None else self.norm(x)


__all__ = ["TransformerEncoder", "TransformerEncoderLayer"]
