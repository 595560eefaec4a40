"""ONNX's attention ops as Tensor operations (see ops.py for the conventions): Attention
(opset 23 and later), with its masks, key/value cache, grouped heads and softcap."""
from __future__ import annotations

import numpy as np

from portkit.abi import dtypes
from portkit.onnx.nn import conv, matmul
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
    return allowed._where(0.0, float("-inf")).cast(dtype)


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
    scores = matmul(q * scale, (k * scale).transpose(2, 3))
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
    all_masked = bias.amax(-1, keepdim=True) == float("-inf")
    weights = all_masked._where(0.0, with_bias.softmax(-1)).cast(q.dtype)
    if mode == 3:
        qk_out = weights
    out = matmul(weights, v)
    if three_d:
        out = out.permute(0, 2, 1, 3)
        out = out.reshape(out.shape[0], out.shape[1], -1)
    return [out, present_key, present_value, qk_out.cast(q.dtype)][:node.outputs]


@op("RotaryEmbedding")
def _rotary_embedding(ctx: Context, node: NodeArgs) -> list[Value]:
    x, cos, sin = (ctx.tensor(node.inputs[i]) for i in range(3))
    shape = x.shape
    # as (batch, sequence, heads, head size)
    x = x.transpose(1, 2) if x.ndim == 4 else x.reshape(*shape[:2], node.attr("num_heads"), -1)
    dim = node.attr("rotary_embedding_dim", 0) or x.shape[3]
    if node.input(3) is not None:
        positions = ctx.tensor(node.inputs[3])
        cos = cos[positions.reshape(-1)].reshape(*positions.shape, -1)
        sin = sin[positions.reshape(-1)].reshape(*positions.shape, -1)
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    rotated, kept = x[..., :dim], x[..., dim:]
    if node.attr("interleaved", 0):
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    else:
        first, second = rotated[..., :dim // 2], rotated[..., dim // 2:]
    real, imaginary = cos * first - sin * second, sin * first + cos * second
    if node.attr("interleaved", 0):
        rotated = cat([real.unsqueeze(-1), imaginary.unsqueeze(-1)], -1).reshape(*rotated.shape)
    else:
        rotated = cat([real, imaginary], -1)
    out = cat([rotated, kept], -1) if dim < x.shape[3] else rotated
    return [out.reshape(*shape) if len(shape) == 3 else out.transpose(1, 2)]


@op("CausalConvWithState")
def _causal_conv_with_state(ctx: Context, node: NodeArgs) -> list[Value]:
    x, weight = ctx.tensor(node.inputs[0]), ctx.tensor(node.inputs[1])
    batch, channels, _ = x.shape
    reach = weight.shape[2] - 1
    past = node.input(3)
    past = Tensor.zeros(batch, channels, reach, dtype=x.dtype, device=x.device) \
        if past is None else ctx.tensor(past)
    padded = cat([past, x], 2)
    bias = None if node.input(2) is None else ctx.tensor(node.inputs[2])
    out = conv(padded, weight, bias, [1], [1], channels)
    if node.attr("activation", "none") in ("silu", "swish"):
        wide = out.cast(dtypes.float32)
        out = (wide * wide.sigmoid()).cast(x.dtype)
    return [out, padded[:, :, padded.shape[2] - reach:]][:node.outputs]


@op("LinearAttention")
def _linear_attention(ctx: Context, node: NodeArgs) -> list[Value]:
    """The recurrence token by token, in float32: decay the state, correct the value by what
    the state already holds (delta rules), add key x value, read with the query."""
    f32 = dtypes.float32
    query, key, value = (ctx.tensor(node.inputs[i]) for i in range(3))
    past, decay, beta = (None if node.input(i) is None else ctx.tensor(node.input(i))
                         for i in range(3, 6))
    q_heads, kv_heads = node.attr("q_num_heads"), node.attr("kv_num_heads")
    batch, steps, _ = query.shape
    q, k, v = (_heads(t, h).cast(f32) for t, h in ((query, q_heads), (key, kv_heads),
                                                      (value, kv_heads)))
    d_k, d_v = q.shape[3], v.shape[3]
    if decay is not None:
        decay = (decay.reshape(batch, steps, kv_heads, 1).transpose(1, 2)
                 if decay.shape[-1] == kv_heads else _heads(decay, kv_heads)).cast(f32)
    if beta is not None:
        beta = beta.reshape(batch, steps, beta.shape[-1], 1).transpose(1, 2).cast(f32)
    state = Tensor.zeros(batch, kv_heads, d_k, d_v, dtype=f32, device=query.device) \
        if past is None else past.cast(f32)
    scale = node.attr("scale", 0.0) or 1 / np.sqrt(d_k)
    outputs = []
    for t in range(steps):
        k_t, v_t = k[:, :, t], v[:, :, t]
        if decay is not None:
            state = state * decay[:, :, t].exp().unsqueeze(-1)
        if beta is not None:
            held = (state * k_t.unsqueeze(-1)).sum(2)
            v_t = beta[:, :, t] * (v_t - held)
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        read = state.repeat_interleave(q_heads // kv_heads, 1) if q_heads != kv_heads else state
        outputs.append(((q[:, :, t].unsqueeze(-1) * read).sum(2) * scale).unsqueeze(2))
    out = cat(outputs, 2).transpose(1, 2).reshape(batch, steps, q_heads * d_v)
    return [out.cast(query.dtype), state.cast(query.dtype if past is None else past.dtype)
            ][:node.outputs]
