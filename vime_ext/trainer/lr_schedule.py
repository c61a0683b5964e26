"""The learning rate per optimizer step, shared by both optimizers (``optimizer.py``, ``megatron_optimizer.py``)."""

import math


class LRSchedule:
    """Linear warm-up to ``lr``, then constant / linear / cosine decay to ``min_lr`` over ``decay_steps``."""

    def __init__(self, lr: float, min_lr: float, style: str, warmup_steps: int, decay_steps: int):
        if style not in ("constant", "linear", "cosine"):
            raise ValueError(f"unknown --lr-decay-style {style!r}")
        self.lr, self.min_lr, self.style = lr, min_lr, style
        self.warmup_steps, self.decay_steps = warmup_steps, max(decay_steps, 1)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.style == "constant":
            return self.lr
        progress = min((step - self.warmup_steps) / max(self.decay_steps - self.warmup_steps, 1), 1.0)
        if self.style == "linear":
            return self.lr - (self.lr - self.min_lr) * progress
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))
