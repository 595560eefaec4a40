"""The optimizers. A step builds every update as one lazy graph and realizes it in one schedule,
so each parameter's update (and its state) is a fused elementwise kernel reading the gradient."""
from __future__ import annotations

import numpy as np

from portkit import autograd, schedule
from portkit.jit import Live
from portkit.tensor import Tensor


class Optimizer:
    """Holds parameters and their state; `step()` applies the gradients."""

    # read afresh at every replay of a portkit.jit step, so a schedule's rate takes effect
    lr = Live()

    def __init__(self, params: list[Tensor], lr: float):
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("optimizer got no tensors with requires_grad=True")
        if not lr >= 0:
            raise ValueError(f"invalid learning rate: {lr} (it must be >= 0)")
        self.lr = lr

    def zero_grad(self) -> None:
        """Drops every parameter's gradient."""
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        """What a resumed run needs: the hyperparameters and, per parameter index, its state
        as numpy arrays (torch's layout: {"state": {i: {...}}, "param_groups": [{...}]})."""
        state = {i: {name: value.numpy() for name, value in tensors.items()
                     if value is not None}
                 for i, tensors in enumerate(self._state_tensors())}
        group = {k: v for k, v in vars(self).items()
                 if isinstance(v, int | float | tuple | bool)}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what state_dict() returned, into this optimizer's existing tensors."""
        for name, value in state_dict["param_groups"][0].items():
            setattr(self, name, value)
        own = self._state_tensors()
        for i, tensors in state_dict["state"].items():
            p = self.params[int(i)]
            for name, array in tensors.items():
                loaded = Tensor(np.asarray(array), p.dtype, p.device)
                if own[int(i)].get(name) is None:
                    self._set_state(int(i), name, loaded)
                else:
                    own[int(i)][name].assign(loaded)

    def _state_tensors(self) -> list[dict[str, Tensor | None]]:
        """Per parameter, its state tensors by name (none for plain SGD)."""
        return [{} for _ in self.params]

    def _set_state(self, i: int, name: str, value: Tensor) -> None:
        raise KeyError(f"{type(self).__name__} has no state {name!r}")

    def step(self) -> None:
        """Applies every parameter's gradient, in one schedule. The scalars backward() ran
        from since the last step (the loss the caller reads next) are computed in it too: a
        loss read afterwards is a copy, not a schedule, compile and launches of its own."""
        updates: list[tuple[Tensor, Tensor]] = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            updates += self._update(i, p, p.grad.detach().cast(p.dtype))
        targets = [t for t, _ in updates]
        for target, value in updates:
            target.assign(value)
        schedule.realize([t.lazy for t in targets] + autograd.take_losses())

    def _update(self, i: int, p: Tensor, g: Tensor) -> list[tuple[Tensor, Tensor]]:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov momentum and weight decay (torch)."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        if momentum < 0 or weight_decay < 0:
            raise ValueError(f"invalid momentum {momentum} or weight_decay {weight_decay}: "
                             "both must be >= 0")
        if nesterov and not momentum:
            raise ValueError("nesterov momentum needs momentum > 0")
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.buffers: list[Tensor | None] = [None] * len(self.params)

    def _state_tensors(self):
        return [{"momentum_buffer": b} for b in self.buffers]

    def _set_state(self, i, name, value):
        if name != "momentum_buffer":
            super()._set_state(i, name, value)
        self.buffers[i] = value

    def _update(self, i, p, g):
        if self.weight_decay:
            g = g + p.detach() * self.weight_decay
        out = []
        if self.momentum:
            b = self.buffers[i]
            b_new = g if b is None else b * self.momentum + g
            if b is None:
                b = self.buffers[i] = Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device)
            out.append((b, b_new))
            g = g + b_new * self.momentum if self.nesterov else b_new
        return out + [(p, p.detach() - g * self.lr)]


class Adam(Optimizer):
    """Adam (Kingma & Ba), as torch.optim.Adam; weight_decay adds to the gradient."""

    decoupled = False
    t = Live()      # the step count: a replay of a portkit.jit step counts too

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        super().__init__(params, lr)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or eps < 0 or weight_decay < 0:
            raise ValueError(f"invalid Adam settings: betas {betas} must be in [0, 1), eps {eps} "
                             f"and weight_decay {weight_decay} >= 0")
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        # made at a parameter's first step, as torch's, on the device it has then (Module.to)
        self.m: list[Tensor | None] = [None] * len(self.params)
        self.v: list[Tensor | None] = [None] * len(self.params)
        self.t = 0

    def step(self) -> None:
        """One Adam step (the bias corrections count steps from 1)."""
        self.t += 1
        super().step()

    def _state_tensors(self):
        return [{"exp_avg": m, "exp_avg_sq": v} for m, v in zip(self.m, self.v)]

    def _set_state(self, i, name, value):
        if name not in ("exp_avg", "exp_avg_sq"):
            super()._set_state(i, name, value)
        (self.m if name == "exp_avg" else self.v)[i] = value

    def _update(self, i, p, g):
        b1, b2 = self.betas
        for state in (self.m, self.v):
            if state[i] is None:
                state[i] = Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device)
        w = p.detach()
        if self.weight_decay and not self.decoupled:
            g = g + w * self.weight_decay
        if self.weight_decay and self.decoupled:
            w = w * (1 - self.lr * self.weight_decay)
        m = self.m[i] * b1 + g * (1 - b1)
        v = self.v[i] * b2 + g * g * (1 - b2)
        # the bias corrections change every step: like every number, they reach the update
        # kernel as scalar arguments, so it compiles once
        m_hat = m * (1 / (1 - b1 ** self.t))
        v_hat = v * (1 / (1 - b2 ** self.t))
        return [(self.m[i], m), (self.v[i], v),
                (p, w - m_hat * self.lr / (v_hat.sqrt() + self.eps))]


class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW; default weight_decay 0.01)."""

    decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)
