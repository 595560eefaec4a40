"""torch.nn.MultiheadAttention: its parameter names and initialization, (L, N, E) layout
(batch_first, unbatched input), masks (True = not attended, as torch's), and the attention
weights averaged over heads or per head."""
from __future__ import annotations

import math

from portkit.nn import functional as F
from portkit.nn.layers import Linear
from portkit.nn.module import Module, deferred, uniform_parameter
from portkit.tensor import Tensor, bool_


class MultiheadAttention(Module):
    """softmax(q k^T / sqrt(head_dim) + masks) v per head, of the projected query, key and
    value, then the output projection (torch.nn.MultiheadAttention; key and value of
    embed_dim features, no add_bias_kv or add_zero_attn)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: int | None = None, vdim: int | None = None, batch_first: bool = False):
        if embed_dim % num_heads:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) or \
                vdim not in (None, embed_dim):
            raise NotImplementedError("MultiheadAttention: add_bias_kv, add_zero_attn and kdim "
                                      "or vdim other than embed_dim are not supported")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.batch_first = batch_first
        self.in_proj_weight = uniform_parameter((3 * embed_dim, embed_dim),
                                                math.sqrt(6 / (4 * embed_dim)))   # xavier
        self.in_proj_bias = _zeros(3 * embed_dim) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if bias:
            self.out_proj.bias = _zeros(embed_dim)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """(attention output, attention weights or None), in the layout of the input."""
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use "
                               "the Transformer module method `generate_square_subsequent_mask`"
                               " to create this mask.")
        unbatched = query.ndim == 2
        q, k, v = ((t.unsqueeze(0) if unbatched else t if self.batch_first else t.transpose(0, 1))
                   for t in (query, key, value))
        if key_padding_mask is not None and unbatched:
            key_padding_mask = key_padding_mask.unsqueeze(0)
        (n, target, e), source = q.shape, k.shape[1]
        heads, dim = self.num_heads, e // self.num_heads
        weights = self.in_proj_weight.chunk(3)
        biases = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else (None,) * 3
        q, k, v = (F.linear(t, w, b).reshape(n, -1, heads, dim).transpose(1, 2)
                   for t, w, b in zip((q, k, v), weights, biases))
        scores = q.matmul(k.transpose(-1, -2)) * (1 / math.sqrt(dim))
        if attn_mask is not None:
            mask = attn_mask.reshape(-1, heads, target, source) if attn_mask.ndim == 3 else \
                attn_mask
            scores = _masked(scores, mask)
        if key_padding_mask is not None:
            scores = _masked(scores, key_padding_mask.reshape(n, 1, 1, source))
        attention = scores.softmax(-1)
        if self.dropout:
            attention = F.dropout(attention, self.dropout, training=self.training)
        out = self.out_proj(attention.matmul(v).transpose(1, 2).reshape(n, target, e))
        out = out.squeeze(0) if unbatched else out if self.batch_first else out.transpose(0, 1)
        if not need_weights:
            return out, None
        attention = attention.mean(1) if average_attn_weights else attention
        return out, attention.squeeze(0) if unbatched else attention

    def extra_repr(self) -> str:
        return ""


def _masked(scores: Tensor, mask: Tensor) -> Tensor:
    """scores with -inf where a bool mask is True, or plus a float mask."""
    return mask._where(float("-inf"), scores) if mask.dtype == bool_ else scores + mask


def _zeros(size: int) -> Tensor:
    return deferred(Tensor.zeros(size).contiguous()).requires_grad_()


__all__ = ["MultiheadAttention"]
