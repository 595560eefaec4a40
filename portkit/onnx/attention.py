"""ONNX's attention ops as Tensor operations (see ops.py for the conventions): Attention
(opset 23 and later), with its masks, key/value cache, grouped heads and softcap."""
from __future__ import annotations

import numpy as np

from portkit.abi import dtypes
from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor, cat

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)


def _heads(x: Tensor, heads: int) -> Tensor:
    """(batch, seq, heads * size) as (batch, heads, seq, size)."""
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, heads, hidden // heads).permute(0, 2, 1, 3)


def _allowed(q_len: int, kv_len: int, offset: Tensor | int, left: int, right: int,
             causal: bool, device: str | None) -> Tensor | None:
    """Where a query may see a key under the causal and sliding-window rules: (q, kv), or
    (batch, 1, q, kv) when `offset` (the keys before the query block) is per batch."""
    if not causal and left < 0 and right < 0:
        return None
    i = Tensor.arange(q_len, device=device).reshape(q_len, 1)
    j = Tensor.arange(kv_len, device=device).reshape(1, kv_len)
    if isinstance(offset, Tensor):
        i = i.reshape(1, 1, q_len, 1) + offset.reshape(-1, 1, 1, 1).cast(i.dtype)
    else:
        i = i + offset
    allowed = None
    for rule in ((j <= i) if causal else None, (i - j <= left) if left >= 0 else None,
                 (j - i <= right) if right >= 0 else None):
        if rule is not None:
            allowed = rule if allowed is None else allowed & rule
    return allowed


def _bias(allowed: Tensor, dtype) -> Tensor:
    return allowed.where(0.0, float("-inf")).cast(dtype)


@op("Attention")
def _attention(ctx: Context, node: NodeArgs) -> list[Value]:
    q, k, v = (ctx.tensor(node.inputs[i]) for i in range(3))
    mask, past_key, past_value, nonpad = (
        None if node.input(i) is None else ctx.tensor(node.input(i)) for i in range(3, 7))
    three_d = q.ndim == 3
    if three_d:
        q = _heads(q, node.attr("q_num_heads"))
        k, v = _heads(k, node.attr("kv_num_heads")), _heads(v, node.attr("kv_num_heads"))
    scale = node.attr("scale")
    scale = np.sqrt(1 / np.sqrt(q.shape[3]) if scale is None else scale)
    scale = float(np.asarray(scale, np.dtype(q.dtype.np)))
    present_key = k if past_key is None else cat([past_key, k], 2)
    present_value = v if past_value is None else cat([past_value, v], 2)
    k, v = present_key, present_value
    q_len, kv_len = q.shape[2], k.shape[2]

    bias = Tensor.zeros(q_len, kv_len, dtype=q.dtype, device=q.device)
    if mask is not None:
        if mask.shape[-1] < kv_len:     # a short mask is padded with "masked"
            fill = False if mask.dtype == dtypes.bool_ else float("-inf")
            mask = mask.pad(((0, 0),) * (mask.ndim - 1) + ((0, kv_len - mask.shape[-1]),),
                            fill)
        bias = bias + (_bias(mask, q.dtype) if mask.dtype == dtypes.bool_ else mask)
    offset: Tensor | int = past_key.shape[2] if past_key is not None else 0
    if past_key is None and nonpad is not None:
        offset = nonpad - q_len
    allowed = _allowed(q_len, kv_len, offset, node.attr("left_window_size", -1),
                       node.attr("right_window_size", -1), bool(node.attr("is_causal", 0)),
                       q.device)
    if allowed is not None:
        bias = bias + _bias(allowed, q.dtype)
    if nonpad is not None:
        keys = Tensor.arange(kv_len, device=q.device).reshape(1, kv_len)
        padded = keys < nonpad.reshape(-1, 1).cast(keys.dtype)
        bias = bias + _bias(padded, q.dtype).reshape(-1, 1, 1, kv_len)

    if q.shape[1] != k.shape[1]:       # grouped heads: each key/value head serves several
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = (q * scale) @ (k * scale).transpose(2, 3)
    softcap = node.attr("softcap", 0.0)
    if softcap > 0:
        scores = (scores / softcap).tanh() * softcap
    with_bias = scores + bias
    mode = node.attr("qk_matmul_output_mode", 0)
    qk_out = with_bias if mode == 2 else scores
    precision = node.attr("softmax_precision")
    if precision is not None:
        import onnx

        with_bias = with_bias.cast(dtypes.from_numpy(
            onnx.helper.tensor_dtype_to_np_dtype(precision)))
    # A row whose bias masks every key attends to nothing: its weights are 0, not NaN.
    all_masked = bias.max(-1, keepdim=True) == float("-inf")
    weights = all_masked.where(0.0, with_bias.softmax(-1)).cast(q.dtype)
    if mode == 3:
        qk_out = weights
    out = weights @ v
    if three_d:
        out = out.permute(0, 2, 1, 3)
        out = out.reshape(out.shape[0], out.shape[1], -1)
    return [out, present_key, present_value, qk_out.cast(q.dtype)][:node.outputs]
