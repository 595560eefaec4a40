"""ONNX's recurrent layers, RNN, GRU and LSTM, as Tensor operations (see ops.py for the
conventions): the time loop runs here, one step of matrix products and gates per element of
the sequence, forward, reverse or both."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from portkit.onnx.ops import Check, Context, NodeArgs, Op, Value, registrar
from portkit.tensor import Tensor, cat, int32, realize

OPS: dict[str, Op] = {}
CHECKS: dict[str, Check] = {}
op = registrar(OPS)

_ACTIVATIONS: dict[str, Callable[[Tensor, float, float], Tensor]] = {
    "Tanh": lambda x, a, b: x.tanh(), "Sigmoid": lambda x, a, b: x.sigmoid(),
    "Relu": lambda x, a, b: x.relu(), "Affine": lambda x, a, b: x * a + b,
    "LeakyRelu": lambda x, a, b: (x < 0)._where(x * a, x),
    "ScaledTanh": lambda x, a, b: (x * b).tanh() * a,
    "HardSigmoid": lambda x, a, b: (x * a + b).clip(0, 1),
    "Softsign": lambda x, a, b: x / (x.abs() + 1), "Softplus": lambda x, a, b: x.softplus(),
}
_DEFAULT_ALPHA = {"LeakyRelu": 0.01, "HardSigmoid": 0.2, "Affine": 1.0, "ScaledTanh": 1.0}
_DEFAULT_BETA = {"HardSigmoid": 0.5, "ScaledTanh": 1.0}
_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _activations(node: NodeArgs, kind: str, directions: int) -> list[list[Callable]]:
    """Per direction, the layer's activation functions with their alpha and beta."""
    names = node.attr("activations") or _DEFAULTS[kind] * directions
    alphas, betas = node.attr("activation_alpha", []), node.attr("activation_beta", [])
    fns = []
    for i, name in enumerate(names):
        a = alphas[i] if i < len(alphas) else _DEFAULT_ALPHA.get(name, 0.0)
        b = betas[i] if i < len(betas) else _DEFAULT_BETA.get(name, 0.0)
        fns.append(lambda x, f=_ACTIVATIONS[name], a=a, b=b: f(x, a, b))
    per = len(_DEFAULTS[kind])
    return [fns[d * per:(d + 1) * per] for d in range(directions)]


def _layer(kind: str) -> Op:
    def run(ctx: Context, node: NodeArgs) -> list[Value]:
        x = ctx.tensor(node.inputs[0])
        if node.attr("layout", 0):
            x = x.transpose(0, 1)          # (batch, seq, input) -> (seq, batch, input)
        steps, batch = x.shape[:2]
        w, r = ctx.tensor(node.inputs[1]), ctx.tensor(node.inputs[2])
        directions, hidden, gates = w.shape[0], node.attr("hidden_size", r.shape[2]), _GATES[kind]
        lengths = node.input(4)
        if lengths is not None and min(ctx.ints(lengths)) < steps:
            raise NotImplementedError(f"{kind} with sequences shorter than the input")
        bias = node.input(3)
        bias = Tensor.zeros(directions, 2 * gates * hidden, dtype=x.dtype, device=x.device) \
            if bias is None else ctx.tensor(bias)

        def state(index: int) -> list[Tensor]:
            # each direction's initial state; one known on the host (zeros by default) is
            # uploaded as a buffer of its own, so that the first step reads its states as
            # every later step does and launches the same kernels
            value = node.input(index)
            if value is None:
                value = np.zeros((directions, batch, hidden), x.dtype.np)
            if isinstance(value, Tensor):
                value = value.transpose(0, 1) if node.attr("layout", 0) else value
                return [value[d] for d in range(directions)]
            value = np.asarray(value)
            value = value.transpose(1, 0, 2) if node.attr("layout", 0) else value
            return [Tensor(np.ascontiguousarray(value[d]), dtype=x.dtype, device=x.device)
                    for d in range(directions)]

        h0, c0 = state(5), state(6) if kind == "LSTM" else None
        peep = node.input(7) if kind == "LSTM" else None
        fns = _activations(node, kind, directions)
        reverse = node.attr("direction", "forward") == "reverse"
        ys, hs, cs = [], [], []
        for d in range(directions):
            order = range(steps - 1, -1, -1) if reverse or d == 1 else range(steps)
            h, c = h0[d], None if c0 is None else c0[d]
            wb, rb = bias[d, :gates * hidden], bias[d, gates * hidden:]
            p = None if peep is None else ctx.tensor(peep)[d]
            inputs = x @ w[d].transpose(0, 1) + wb       # every step's input part at once
            outputs: list[Tensor | None] = [None] * steps
            for t in order:
                h, c = _STEPS[kind](node, fns[d], _step(inputs, t), h, c, r[d], rb, p, hidden)
                # each step is realized on its own: from the second on (the first computes
                # `inputs` too) every step's graph has one structure, which the runner
                # replays without scheduling, so a longer sequence's first call costs more
                # launches, not a larger graph to schedule
                realize(*(v for v in (inputs, h, c) if v is not None))
                outputs[t] = h.unsqueeze(0)
            ys.append(cat(outputs, 0).unsqueeze(1))
            hs.append(h.unsqueeze(0))
            cs.append(None if c is None else c.unsqueeze(0))
        y, y_h = cat(ys, 1), cat(hs, 0)
        if node.attr("layout", 0):
            y, y_h = y.permute(2, 0, 1, 3), y_h.transpose(0, 1)
        outs = [y, y_h]
        if kind == "LSTM":
            y_c = cat(cs, 0)
            outs.append(y_c.transpose(0, 1) if node.attr("layout", 0) else y_c)
        return outs[:node.outputs]
    return run


def _step(inputs: Tensor, t: int) -> Tensor:
    """inputs[t], read at a position that is a scalar argument of the step's kernels (an
    index constant, in range by construction), not code: the view inputs[t] put t's offset
    into each step's code, so a sequence of n steps compiled n kernels of one shape."""
    at = Tensor.full((1,), t, dtype=int32, device=inputs.device)
    return inputs._take(0, at, "index", wrap=False, check=False)[0]


def _clip(node: NodeArgs, x: Tensor) -> Tensor:
    limit = node.attr("clip")
    return x if limit is None else x.clip(-limit, limit)


def _rnn_step(node, fns, xw, h, c, r, rb, p, hidden):
    return fns[0](_clip(node, xw + h @ r.transpose(0, 1) + rb)), None


def _gru_step(node, fns, xw, h, c, r, rb, p, hidden):
    f, g = fns
    parts = [slice(i * hidden, (i + 1) * hidden) for i in range(3)]
    # z and r are the first two gates, adjacent: one product and one activation for both
    both = slice(0, 2 * hidden)
    # linear before reset (torch's GRU): the candidate's product reads h too, so one product
    # of all three gates, sliced: one launch of 3 x hidden rows a step, not two
    linear = node.attr("linear_before_reset", 0)
    hr = h @ r.transpose(0, 1) if linear else h @ r[both].transpose(0, 1)
    active = f(_clip(node, xw[:, both] + hr[:, both] + rb[both]))
    z, reset = active[:, parts[0]], active[:, parts[1]]
    if linear:
        candidate = reset * (hr[:, parts[2]] + rb[parts[2]])
    else:
        candidate = (reset * h) @ r[parts[2]].transpose(0, 1) + rb[parts[2]]
    new = g(_clip(node, xw[:, parts[2]] + candidate))
    return (1 - z) * new + z * h, None


def _lstm_step(node, fns, xw, h, c, r, rb, p, hidden):
    f, g, out = fns
    gates = xw + h @ r.transpose(0, 1) + rb
    cell = gates[:, 3 * hidden:]
    if p is None:
        # i, o and f are ONNX's first three gates: one activation over all three builds a
        # third of the graph that three would
        active = f(_clip(node, gates[:, :3 * hidden]))
        i, o, forget = (active[:, k * hidden:(k + 1) * hidden] for k in range(3))
    else:
        i, o, forget = (gates[:, k * hidden:(k + 1) * hidden] for k in range(3))
        i = f(_clip(node, i + p[:hidden] * c))
        forget = f(_clip(node, forget + p[2 * hidden:] * c))
    if node.attr("input_forget", 0):
        forget = 1 - i
    c = forget * c + i * g(_clip(node, cell))
    if p is not None:
        o = f(_clip(node, o + p[hidden:2 * hidden] * c))
    return o * out(c), c


_STEPS = {"RNN": _rnn_step, "GRU": _gru_step, "LSTM": _lstm_step}
OPS.update({kind: _layer(kind) for kind in _GATES})
