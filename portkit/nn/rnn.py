"""The recurrent layers of torch.nn: RNN (tanh or relu), LSTM and GRU, with torch's
parameter names, shapes, initialization, gate order and (seq, batch, feature) layout
(batch_first, unbatched input, several layers, bidirectional, dropout between layers).

The time loop runs here, one step of products and gates per element of the sequence; outside
portkit.jit each step is realized on its own, so that every step has a graph of one structure
and a long sequence costs launches, not one graph too large to schedule.
"""
from __future__ import annotations

import math

from portkit import schedule
from portkit.nn import functional as F
from portkit.nn.module import Module, uniform_parameter
from portkit.tensor import Tensor, cat, realize, stack


class _RNNBase(Module):
    """A stack of recurrent layers, each one direction or two, of `gates` gates a step."""

    gates = 1

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0):
        if proj_size:
            raise NotImplementedError(f"{type(self).__name__}: proj_size is not supported")
        if not 0 <= dropout <= 1:
            raise ValueError(f"dropout should be a number in range [0, 1], got {dropout}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, dropout
        self.bidirectional = bidirectional
        bound = 1 / math.sqrt(hidden_size)
        rows = self.gates * hidden_size
        for name, layer, _ in self._cells():
            inputs = input_size if layer == 0 else hidden_size * self.directions
            setattr(self, f"weight_ih_{name}", uniform_parameter((rows, inputs), bound))
            setattr(self, f"weight_hh_{name}", uniform_parameter((rows, hidden_size), bound))
            if bias:
                setattr(self, f"bias_ih_{name}", uniform_parameter((rows,), bound))
                setattr(self, f"bias_hh_{name}", uniform_parameter((rows,), bound))

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _cells(self) -> list[tuple[str, int, int]]:
        """(parameter suffix, layer, direction) of each cell, in torch's order."""
        return [(f"l{layer}{'_reverse' if d else ''}", layer, d)
                for layer in range(self.num_layers) for d in range(self.directions)]

    def _step(self, x: Tensor, state: tuple[Tensor, ...], w_hh: Tensor, b_hh: Tensor | None
              ) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def forward(self, input: Tensor, hx: Tensor | tuple[Tensor, ...] | None = None):
        """The last layer's h at every step, and each cell's last state (h, or (h, c))."""
        if input.ndim not in (2, 3):
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got "
                             f"{input.ndim}D instead")
        unbatched = input.ndim == 2
        x = input.unsqueeze(1) if unbatched else input.transpose(0, 1) if self.batch_first \
            else input
        steps = x.shape[0]
        states = self._initial(hx, x, unbatched)
        finals = []
        for layer in range(self.num_layers):
            outputs = []
            for name, _, d in self._cells()[layer * self.directions:][:self.directions]:
                b_ih, b_hh = (getattr(self, f"bias_ih_{name}"), getattr(self, f"bias_hh_{name}")
                              ) if self.bias else (None, None)
                projected = F.linear(x, getattr(self, f"weight_ih_{name}"), b_ih)
                state = tuple(s[layer * self.directions + d] for s in states)
                hs: list[Tensor] = []
                for t in (range(steps - 1, -1, -1) if d else range(steps)):
                    state = self._step(projected[t], state, getattr(self, f"weight_hh_{name}"),
                                       b_hh)
                    if not schedule.recording():
                        realize(*state)
                    hs.append(state[0])
                outputs.append(stack(hs[::-1] if d else hs))
                finals.append(state)
            x = cat(outputs, -1) if len(outputs) > 1 else outputs[0]
            if self.dropout and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=self.training)
        out = x.squeeze(1) if unbatched else x.transpose(0, 1) if self.batch_first else x
        last = tuple(stack([s[i] for s in finals]) for i in range(len(states)))
        last = tuple(s.squeeze(1) for s in last) if unbatched else last
        return out, last if len(last) > 1 else last[0]

    def _initial(self, hx, x: Tensor, unbatched: bool) -> tuple[Tensor, ...]:
        """The initial states, each (layers * directions, batch, hidden); zeros if not given."""
        count = 2 if self.gates == 4 else 1           # an LSTM's (h, c), else h
        if hx is None:
            shape = (self.num_layers * self.directions, x.shape[1], self.hidden_size)
            return (Tensor.zeros(*shape, dtype=x.dtype, device=x.device),) * count
        given = tuple(hx) if isinstance(hx, tuple | list) else (hx,)
        if len(given) != count:
            raise ValueError(f"{type(self).__name__}: expected {count} initial state(s), got "
                             f"{len(given)}")
        return tuple(s.unsqueeze(1) if unbatched else s for s in given)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        text += f", num_layers={self.num_layers}" if self.num_layers != 1 else ""
        text += ", bias=False" if not self.bias else ""
        text += ", batch_first=True" if self.batch_first else ""
        text += f", dropout={self.dropout}" if self.dropout else ""
        return text + (", bidirectional=True" if self.bidirectional else "")


class RNN(_RNNBase):
    """h' = tanh (or relu) of x W_ih^T + b_ih + h W_hh^T + b_hh (torch.nn.RNN)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             f"'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional)

    def _step(self, x, state, w_hh, b_hh):
        pre = x + F.linear(state[0], w_hh, b_hh)
        return (pre.tanh() if self.nonlinearity == "tanh" else pre.relu(),)



class LSTM(_RNNBase):
    """Gates i, f, g, o of x W_ih^T + b_ih + h W_hh^T + b_hh; c' = f c + i g, h' = o tanh(c')
    (torch.nn.LSTM; no proj_size). Returns (output, (h_n, c_n))."""

    gates = 4

    def _step(self, x, state, w_hh, b_hh):
        h, c = state
        gates = x + F.linear(h, w_hh, b_hh)
        # one sigmoid over the four gates, g's share unused: one copy of its formula in the
        # graph where three made an eager step's graph a third larger
        i, f, _, o = gates.sigmoid().chunk(4, -1)
        c = f * c + i * gates.chunk(4, -1)[2].tanh()
        return o * c.tanh(), c


class GRU(_RNNBase):
    """Gates r, z and candidate n = tanh(x_n + r (h W_hn^T + b_hn)); h' = (1 - z) n + z h
    (torch.nn.GRU)."""

    gates = 3

    def _step(self, x, state, w_hh, b_hh):
        h = state[0]
        hidden = h.shape[-1]
        projected = F.linear(h, w_hh, b_hh)
        r, z = (x[..., :2 * hidden] + projected[..., :2 * hidden]).sigmoid().chunk(2, -1)
        x_n, h_n = x[..., 2 * hidden:], projected[..., 2 * hidden:]
        n = (x_n + r * h_n).tanh()
        return (n + z * (h - n),)


__all__ = ["GRU", "LSTM", "RNN"]
