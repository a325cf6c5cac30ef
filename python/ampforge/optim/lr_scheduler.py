"""Learning-rate schedulers, as torch.optim.lr_scheduler: call scheduler.step() after optimizer.step() (per step or
per epoch, as you count T_max / step_size)."""
from .._core import LRScheduler


class CosineAnnealingLR(LRScheduler):
    """lr from each group's base lr down to eta_min over T_max steps, along a half cosine."""

    def __init__(self, optimizer, T_max, eta_min=0.0):
        super().__init__(optimizer, "cosine", total_steps=T_max, min_lr=eta_min)


class StepLR(LRScheduler):
    """lr multiplied by gamma every step_size steps."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        super().__init__(optimizer, "step", step_size=step_size, gamma=gamma)


__all__ = ["LRScheduler", "CosineAnnealingLR", "StepLR"]
