"""Optimizers (optimizers.py) and learning-rate schedules (lr_scheduler.py), as torch.optim has
them. A step builds every update as one lazy graph and realizes it in one schedule."""
from portkit.optim import lr_scheduler
from portkit.optim.optimizers import SGD, Adam, AdamW, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "lr_scheduler"]
