"""Learning-rate schedules, as torch.optim.lr_scheduler: each sets its optimizer's `lr` from the
epoch count (a closed form of the step count), so a schedule resumed from its state_dict
continues exactly where it stopped."""
from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

from portkit.optim.optimizers import Optimizer


class LRScheduler:
    """Base of schedules: `step()` advances the epoch and sets optimizer.lr = lr_at(epoch)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} needs a portkit.optim optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        # where a resumed schedule starts from, as torch keeps it (initial_lr)
        self.base_lr = getattr(optimizer, "initial_lr", optimizer.lr)
        optimizer.initial_lr = self.base_lr
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, epoch: int) -> float:
        """The learning rate of `epoch` (0 is the one the optimizer starts with)."""
        raise NotImplementedError

    def step(self) -> None:
        """Advances one epoch (call after optimizer.step(), as in torch)."""
        self.last_epoch += 1
        self.optimizer.lr = self.lr_at(self.last_epoch)

    def get_last_lr(self) -> list[float]:
        """The learning rate the last step() set, as a one-element list (torch's form)."""
        return [self.optimizer.lr]

    def state_dict(self) -> dict:
        """Everything but the optimizer (and functions, which do not pickle)."""
        return {k: v for k, v in vars(self).items()
                if k != "optimizer" and not callable(v)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what state_dict() returned."""
        vars(self).update(state_dict)


class StepLR(LRScheduler):
    """lr * gamma every step_size epochs."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1):
        if not isinstance(step_size, int) or step_size < 1:
            raise ValueError(f"StepLR: step_size must be an int >= 1, got {step_size!r}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """lr * gamma at each epoch in `milestones`."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1,
                 last_epoch: int = -1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** bisect.bisect_right(self.milestones, epoch)


class ExponentialLR(LRScheduler):
    """lr * gamma every epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** epoch


class CosineAnnealingLR(LRScheduler):
    """From lr down to eta_min along half a cosine over T_max epochs (and back up after)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1):
        if not T_max > 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be > 0, got {T_max!r}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        cosine = (1 + math.cos(math.pi * epoch / self.T_max)) / 2
        return self.eta_min + (self.base_lr - self.eta_min) * cosine


class LambdaLR(LRScheduler):
    """lr * lr_lambda(epoch)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float],
                 last_epoch: int = -1):
        if not callable(lr_lambda):
            raise TypeError(f"LambdaLR: lr_lambda must be a function of the epoch, got "
                            f"{type(lr_lambda).__name__}")
        self.lr_lambda = lr_lambda
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.lr_lambda(epoch)


class LinearLR(LRScheduler):
    """lr * a factor going linearly from start_factor to end_factor over total_iters epochs."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1 / 3,
                 end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1):
        if not (0 < start_factor <= 1 and 0 <= end_factor <= 1):
            raise ValueError(f"LinearLR: start_factor must be in (0, 1] and end_factor in "
                             f"[0, 1], got {start_factor} and {end_factor}")
        self.start_factor, self.end_factor = start_factor, end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def lr_at(self, epoch: int) -> float:
        done = min(epoch, self.total_iters) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)


class OneCycleLR(LRScheduler):
    """The 1cycle policy (torch.optim.lr_scheduler.OneCycleLR): lr rises from max_lr /
    div_factor to max_lr over pct_start of total_steps, then anneals to that / final_div_factor
    (a third phase first returns to the start with three_phase); momentum (SGD's, or Adam's
    beta1) moves the opposite way when cycle_momentum."""

    def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None,
                 pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum: float = 0.85,
                 max_momentum: float = 0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1):
        if total_steps is None:
            if not (epochs and steps_per_epoch):
                raise ValueError("OneCycleLR: pass total_steps, or epochs and steps_per_epoch")
            total_steps = epochs * steps_per_epoch
        if total_steps <= 0 or not 0 <= pct_start <= 1 or anneal_strategy not in ("cos",
                                                                                  "linear"):
            raise ValueError(f"OneCycleLR: total_steps must be > 0 ({total_steps}), pct_start "
                             f"in [0, 1] ({pct_start}), anneal_strategy 'cos' or 'linear' "
                             f"({anneal_strategy!r})")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum and not (getattr(optimizer, "momentum", 0) or
                                   hasattr(optimizer, "betas")):
            raise ValueError("OneCycleLR: cycle_momentum needs an optimizer with momentum "
                             "(SGD(momentum=...)) or betas (Adam); or pass cycle_momentum=False")
        self.total_steps, self.anneal_strategy = total_steps, anneal_strategy
        start, peak = max_lr / div_factor, max_lr
        low = start / final_div_factor
        # (last step of the phase, lr at its start and end, momentum at its start and end)
        first = float(pct_start * total_steps) - 1
        if three_phase:
            self.phases = [(first, start, peak, max_momentum, base_momentum),
                           (2 * first, peak, start, base_momentum, max_momentum),
                           (total_steps - 1, start, low, max_momentum, max_momentum)]
        else:
            self.phases = [(first, start, peak, max_momentum, base_momentum),
                           (total_steps - 1, peak, low, base_momentum, max_momentum)]
        optimizer.initial_lr = start
        super().__init__(optimizer, last_epoch)

    def _anneal(self, begin: float, end: float, fraction: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (begin - end) / 2 * (math.cos(math.pi * fraction) + 1)
        return (end - begin) * fraction + begin

    def lr_at(self, epoch: int) -> float:
        if epoch > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {epoch} times, past total_steps "
                             f"{self.total_steps}")
        begin = 0.0
        for end, lr0, lr1, m0, m1 in self.phases:
            if epoch <= end or end == self.phases[-1][0]:
                break
            begin = end
        fraction = (epoch - begin) / (end - begin)
        if self.cycle_momentum:
            self._set_momentum(self._anneal(m0, m1, fraction))
        return self._anneal(lr0, lr1, fraction)

    def _set_momentum(self, momentum: float) -> None:
        if hasattr(self.optimizer, "betas"):
            self.optimizer.betas = (momentum, self.optimizer.betas[1])
        else:
            self.optimizer.momentum = momentum


class ReduceLROnPlateau:
    """lr * factor once a metric has not improved for `patience` steps (torch's rules: a
    relative or absolute threshold, a cooldown, a floor at min_lr)."""

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.1,
                 patience: int = 10, threshold: float = 1e-4, threshold_mode: str = "rel",
                 cooldown: int = 0, min_lr: float = 0.0, eps: float = 1e-8):
        if not factor < 1.0 or mode not in ("min", "max") or threshold_mode not in ("rel",
                                                                                   "abs"):
            raise ValueError(f"ReduceLROnPlateau: factor must be < 1 ({factor}), mode 'min' or "
                             f"'max' ({mode!r}), threshold_mode 'rel' or 'abs' "
                             f"({threshold_mode!r})")
        self.optimizer = optimizer
        self.mode, self.factor, self.patience = mode, factor, patience
        self.threshold, self.threshold_mode = threshold, threshold_mode
        self.cooldown, self.min_lr, self.eps = cooldown, min_lr, eps
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad_epochs = self.cooldown_counter = 0
        self.last_epoch = 0

    def step(self, metrics: float) -> None:
        """Records this epoch's metric; lowers the learning rate if it has stalled."""
        current = float(metrics)
        self.last_epoch += 1
        if self._better(current):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            lowered = max(self.optimizer.lr * self.factor, self.min_lr)
            if self.optimizer.lr - lowered > self.eps:
                self.optimizer.lr = lowered
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0

    def _better(self, current: float) -> bool:
        if self.threshold_mode == "rel":
            scale = 1 - self.threshold if self.mode == "min" else 1 + self.threshold
            bound = self.best * scale
        else:
            bound = self.best - self.threshold if self.mode == "min" else \
                self.best + self.threshold
        return current < bound if self.mode == "min" else current > bound

    def get_last_lr(self) -> list[float]:
        """The optimizer's learning rate, as a one-element list (torch's form)."""
        return [self.optimizer.lr]

    def state_dict(self) -> dict:
        """Everything but the optimizer."""
        return {k: v for k, v in vars(self).items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what state_dict() returned."""
        vars(self).update(state_dict)


__all__ = ["CosineAnnealingLR", "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR",
           "MultiStepLR", "OneCycleLR", "ReduceLROnPlateau", "StepLR"]
