"""Advantage estimators."""

import torch


def grpo_advantages(rewards: torch.Tensor, group_size: int, normalize_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages: each reward minus its group's mean, optionally over the group's std.

    ``rewards`` is flat, groups contiguous (``n_samples_per_prompt`` consecutive samples per prompt). The std is
    the unbiased one; a group whose rewards are all equal gets zero advantages either way.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"expected a flat tensor of whole groups of {group_size}, got shape {tuple(rewards.shape)}")
    grouped = rewards.float().view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std and group_size > 1:
        std = grouped.std(dim=1, keepdim=True)
        centered = torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))
    return centered.view(-1)
