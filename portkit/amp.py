"""Mixed-precision training, as torch.amp: `autocast` runs the forward pass's matmuls in bfloat16
or float16 (portkit/tensor/autocast_mode.py), and `GradScaler` keeps float16's small gradients
from flushing to zero by scaling the loss, then unscales the gradients before the optimizer
step, skips a step whose gradients overflowed and adapts the scale.

The parameters stay float32 throughout (master weights): the casts in the forward pass send
float32 gradients back to them, so the optimizer updates float32 values.
"""
from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from portkit.tensor import Tensor, autocast, float16, realize
from portkit.tensor.autocast_mode import get_autocast_dtype, is_autocast_enabled

if TYPE_CHECKING:
    from portkit.optim.optimizers import Optimizer

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled"]


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class _OptimizerState:
    """Where one optimizer is in the iteration, and whether its gradients held inf or NaN."""

    def __init__(self) -> None:
        self.stage = _Stage.READY
        self.found_inf: bool | None = None


class GradScaler:
    """torch.amp.GradScaler: scale(loss).backward(), then step(optimizer), which unscales the
    gradients and skips the step if any is inf or NaN, then update(), which halves the scale
    after a skipped step (backoff_factor) and doubles it after growth_interval good ones.

    The scale is a Python float (get_scale()); a multiply by it reaches the kernels as a scalar
    argument. `device` is accepted for torch's signature. With enabled=False every method passes
    through (scale returns its argument, step calls optimizer.step())."""

    def __init__(self, device: str = "cpu", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True):
        if not growth_factor > 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError(f"GradScaler: growth_factor {growth_factor} must be > 1, "
                             f"backoff_factor {backoff_factor} in (0, 1) and growth_interval "
                             f"{growth_interval} >= 1")
        self.device, self._enabled = device, enabled
        self._init_scale = float(init_scale)
        self._scale: float | None = None
        self._growth_factor, self._backoff_factor = growth_factor, backoff_factor
        self._growth_interval, self._growth_tracker = growth_interval, 0
        self._per_optimizer: dict[int, _OptimizerState] = {}

    def scale(self, outputs: Any) -> Any:
        """outputs (a tensor, or lists and tuples of them) times the scale."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = self._init_scale
        scale = self._scale
        return _apply(outputs, lambda t: t * scale)

    def unscale_(self, optimizer: Optimizer) -> None:
        """Divides the optimizer's gradients by the scale, in place, and records whether any
        is inf or NaN; call it before reading or clipping gradients. step() calls it if you
        did not."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state.stage is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update()")
        if state.stage is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step(); call update() first")
        if self._scale is None:
            raise RuntimeError("unscale_() before scale(): scale the loss with "
                               "scaler.scale(loss) before backward()")
        # Tensor.grad is typed by its first assignment, None: read it as what it may be
        grads: list[tuple[Tensor, Tensor]] = [(p, g) for p in optimizer.params
                                              if (g := _grad(p)) is not None]
        if any(g.dtype == float16 for _, g in grads):
            raise ValueError("Attempting to unscale FP16 gradients: keep the parameters "
                             "float32 and run the forward pass under portkit.autocast")
        inverse = float(np.float32(1.0 / self._scale))      # rounded to float32, as torch's
        unscaled = [g.detach() * inverse for _, g in grads]
        state.found_inf = False
        if unscaled:
            nonfinite = (~unscaled[0].isfinite()).any()
            for g in unscaled[1:]:
                nonfinite = nonfinite | (~g.isfinite()).any()
            realize(nonfinite, *unscaled)
            state.found_inf = bool(nonfinite.item())
        for (p, _), g in zip(grads, unscaled):
            p.grad = g  # type: ignore[assignment]
        state.stage = _Stage.UNSCALED

    def step(self, optimizer: Optimizer, *args: Any, **kwargs: Any) -> Any:
        """optimizer.step(*args, **kwargs) with unscaled gradients, unless one is inf or NaN
        (then the step is skipped and None returned)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("GradScaler.step: a closure is not supported while the scaler "
                               "is enabled")
        state = self._state(optimizer)
        if state.stage is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update()")
        if state.stage is _Stage.READY:
            self.unscale_(optimizer)
        result = None
        if not state.found_inf:
            result = optimizer.step(*args, **kwargs)  # type: ignore[func-returns-value]
        state.stage = _Stage.STEPPED
        return result

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Sets the scale for the next iteration: new_scale if given, else the scale times
        backoff_factor if a gradient was inf or NaN this iteration, times growth_factor after
        growth_interval iterations without one, else unchanged."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
        else:
            found = [s.found_inf for s in self._per_optimizer.values() if s.found_inf is not None]
            if not found:
                raise RuntimeError("update(): no inf checks were recorded this iteration; call "
                                   "step(optimizer) (or unscale_) first")
            assert self._scale is not None     # found only by unscale_, which needs a scale
            if any(found):
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale *= self._growth_factor
                    self._growth_tracker = 0
        self._per_optimizer.clear()

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def is_enabled(self) -> bool:
        """Whether the scaler scales (enabled=True)."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """The scale and its growth settings, under torch's keys (empty when disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what state_dict() returned."""
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("load_state_dict: the state dict is empty (it came from a "
                               "disabled GradScaler)")
        self._scale = float(state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._growth_tracker = state_dict["_growth_tracker"]

    def _state(self, optimizer: Optimizer) -> _OptimizerState:
        return self._per_optimizer.setdefault(id(optimizer), _OptimizerState())


def _grad(p: Tensor) -> Tensor | None:
    return p.grad


def _apply(outputs: Any, scale: Callable[[Tensor], Tensor]) -> Any:
    if isinstance(outputs, Tensor):
        return scale(outputs)
    if isinstance(outputs, list | tuple):
        return type(outputs)(_apply(o, scale) for o in outputs)
    raise TypeError(f"GradScaler.scale: outputs must be a Tensor or lists/tuples of them, got "
                    f"{type(outputs).__name__}")
