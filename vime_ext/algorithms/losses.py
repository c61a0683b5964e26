"""Per-token policy-gradient pieces and how they are reduced to one loss."""

from typing import Literal

import torch

KLType = Literal["k1", "k2", "k3", "low_var_kl"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: KLType) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) + log r - 1 with log r = logp - logp_ref (Schulman's
    estimators); low_var_kl is k3 clamped to [-10, 10] for stability.
    """
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        k3 = torch.exp(-log_ratio) + log_ratio - 1.0
        return k3.clamp(-10.0, 10.0) if kind == "low_var_kl" else k3
    raise ValueError(f"unknown KL type {kind!r}; choose k1, k2, k3 or low_var_kl")


def clipped_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                        eps_clip: float, eps_clip_high: float | None = None,
                        eps_clip_c: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, with clip-higher (``eps_clip_high`` > ``eps_clip`` lets rare tokens
    grow more) and dual-clip (``eps_clip_c`` = C > 1: where the advantage is negative, the loss is at most
    -C x advantage, so a token whose ratio has run far up cannot push it further). Returns (loss per token, 1.0
    where the clipped branch was taken)."""
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp(log_probs.float() - old_log_probs.float())
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    loss = torch.maximum(unclipped, clipped)
    if eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * eps_clip_c), loss)
    return loss, (clipped > unclipped).float()


def gspo_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                     loss_mask: torch.Tensor, eps_clip: float,
                     eps_clip_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO: PPO's clipped surrogate on each row's sequence-level ratio, the geometric mean of its token ratios
    over the trained tokens; every token carries it, with the token's own log-prob for the gradient
    (sg[s] x p / sg[p]). Its clip range is of another scale than PPO's (the paper's 3e-4 / 4e-4). Returns (loss
    per token, 1.0 where the clipped branch was taken)."""
    high = eps_clip if eps_clip_high is None else eps_clip_high
    mask = loss_mask.float()
    log_ratio = (log_probs.float() - old_log_probs.float()) * mask
    sequence = log_ratio.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    log_s = log_probs.float() - log_probs.float().detach() + sequence.detach()
    ratio = torch.exp(log_s.clamp(max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def cispo_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                      eps_clip: float, eps_clip_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO: the importance ratio, clipped to [1 - eps_clip, 1 + eps_clip_high] and without gradient, weighs
    the advantage times the token's log-prob: every token keeps a gradient, however far its ratio ran. Returns
    (loss per token, 1.0 where the ratio was clipped)."""
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp((log_probs.float() - old_log_probs.float()).clamp(-20.0, 20.0))
    weight = ratio.clamp(1.0 - eps_clip, 1.0 + high).detach()
    return -weight * advantages * log_probs.float(), (weight != ratio).float()


TISLevel = Literal["token", "sequence"]
_LOG_RATIO_BOUND = 20.0  # exp(20) is far above any cap and exp(-20) below any floor: the weights stay finite


def rollout_correction_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                               loss_mask: torch.Tensor, cap: float, level: TISLevel = "token",
                               floor: float | None = None) -> torch.Tensor:
    """Importance weights p_trainer / p_engine for tokens the engine sampled from another distribution than the
    trainer's (other kernels and precision; with --async-training, older weights). ``level`` token: one weight
    per token; sequence: the product over the row's trained tokens, on each of them. Without ``floor`` a weight
    above ``cap`` is cut to it (truncated IS); with it, a weight outside [floor, cap] is set to 0, so the token
    (or the sequence) trains nothing (IcePop-style masking). Zero off the mask; no gradient."""
    mask = loss_mask.float()
    log_ratio = (old_log_probs.float() - rollout_log_probs.float()) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(log_ratio)
    elif level != "token":
        raise ValueError(f"unknown importance-weight level {level!r}; choose token or sequence")
    raw = torch.exp(log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)) * mask
    if floor is None:
        return raw.clamp(max=cap).detach()
    return torch.where((raw >= floor) & (raw <= cap), raw, torch.zeros_like(raw)).detach()


def token_weights(loss_mask: torch.Tensor, mode: Aggregation, total_tokens: float,
                  total_sequences: float) -> torch.Tensor:
    """Per-token weights that turn a sum into the ``mode`` average over a whole batch.

    ``total_tokens`` / ``total_sequences`` count the batch the average is over, which may be larger than
    ``loss_mask`` (micro-batches and data-parallel shards of one optimizer step each add their weighted sums).
    token_mean: every trained token weighs the same (long answers weigh more); seq_mean_token_mean: every
    sequence weighs the same; seq_mean_token_sum: per-sequence sums, averaged over sequences.
    """
    mask = loss_mask.float()
    if mode == "token_mean":
        return mask / max(total_tokens, 1.0)
    if mode == "seq_mean_token_mean":
        return mask / mask.sum(dim=-1, keepdim=True).clamp(min=1.0) / max(total_sequences, 1.0)
    if mode == "seq_mean_token_sum":
        return mask / max(total_sequences, 1.0)
    raise ValueError(f"unknown aggregation {mode!r}")


def aggregate(per_token: torch.Tensor, loss_mask: torch.Tensor, mode: Aggregation) -> torch.Tensor:
    """Reduce ``[batch, tokens]`` values over the masked tokens of this batch (see ``token_weights``)."""
    weights = token_weights(loss_mask, mode, loss_mask.float().sum().item(), loss_mask.shape[0])
    return (per_token * weights).sum()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dim, per position."""
    log_p = torch.log_softmax(logits.float(), dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       value_clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's value loss per token, ``0.5 * max((v - R)^2, (v_clip - R)^2)`` with ``v_clip`` kept within
    ``value_clip`` of the value before this rollout's updates (no clipping when ``value_clip`` is None).
    Returns (loss per token, 1.0 where the clipped branch was larger)."""
    values, old_values, returns = values.float(), old_values.float(), returns.float()
    unclipped = (values - returns).square()
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    clipped = (clipped_values - returns).square()
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()
