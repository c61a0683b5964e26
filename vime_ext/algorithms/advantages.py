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


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the masked (generated) tokens of each row; returns (advantages,
    returns), both zero where the mask is 0.

    ``rewards``, ``values``, ``loss_mask``: ``[batch, tokens]``. Unmasked positions (prompt, tool output,
    padding) are skipped, not treated as steps: the next action after a tool result bootstraps from the value
    of the next generated token, and the last generated token bootstraps from 0 (the episode ends there).
    """
    if not (rewards.shape == values.shape == loss_mask.shape) or rewards.ndim != 2:
        raise ValueError(f"rewards, values and loss_mask must be equal [batch, tokens] shapes, got "
                         f"{tuple(rewards.shape)}, {tuple(values.shape)}, {tuple(loss_mask.shape)}")
    rewards, values, mask = rewards.float(), values.float(), loss_mask > 0
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(next_value)
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        here = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(mask[:, t], here, 0.0)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        next_advantage = torch.where(mask[:, t], here, next_advantage)
    return advantages, torch.where(mask, advantages + values, 0.0)


def terminal_rewards(sequence_rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``[batch, tokens]`` rewards: each row's scalar reward on its last masked token, 0 elsewhere."""
    mask = loss_mask > 0
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = sequence_rewards.float().to(mask.device)[rows]
    return out


def whiten(values: torch.Tensor, loss_mask: torch.Tensor, total: tuple[float, float, float],
           eps: float = 1e-8) -> torch.Tensor:
    """``(values - mean) / std`` on the masked tokens, where ``total`` = (count, sum, sum of squares) over the
    whole batch (all micro-batches and ranks) these values are part of; 0 where the mask is 0."""
    count, first, second = total
    mean = first / max(count, 1.0)
    var = max(second / max(count, 1.0) - mean * mean, 0.0)
    return torch.where(loss_mask > 0, (values - mean) / (var ** 0.5 + eps), 0.0)
