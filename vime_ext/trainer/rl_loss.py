"""The losses of one micro-batch, computed on the last pipeline stage from vocab-sharded logits: the policy
loss (RL), the negative log-likelihood of the trained tokens (SFT, ``--loss-type sft_loss``), and the critic's
value loss.

Each micro-batch contributes ``sum(per_token_loss * token_weights)``, with weights normalised over the whole
optimizer step (every micro-batch on every data-parallel rank), so summing gradients over micro-batches and
data-parallel ranks gives exactly the gradient of the step's loss. Statistics are weighted the same way, so their
sums over micro-batches and ranks are the step's averages.
"""

from dataclasses import dataclass

import torch

from vime_ext.algorithms.losses import (
    cispo_policy_loss,
    clipped_policy_loss,
    clipped_value_loss,
    gspo_policy_loss,
    kl_penalty,
    rollout_correction_weights,
    token_weights,
)
from vime_ext.models.model_config import ModelShape
from vime_ext.trainer.batching import MicroBatch
from vime_ext.trainer.forward import position_log_probs, vocab_shard
from vime_ext.trainer.packing import to_rows


@dataclass(frozen=True)
class LossSettings:
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    eps_clip_c: float | None = None
    policy_loss: str = "ppo"
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    entropy_coef: float = 0.0
    aggregation: str = "token_mean"
    use_tis: bool = False
    tis_cap: float = 2.0
    tis_level: str = "token"
    tis_floor: float | None = None
    temperature: float = 1.0


def vocab_parallel_entropy(logits: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Entropy per row of ``[tokens, vocab/TP]`` sharded logits (padding columns excluded), differentiable (for
    an entropy bonus; as a statistic alone it comes out of the log-prob chunks)."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    shard = vocab_shard(shape)
    logits = logits.float()
    if shard.valid < shard.columns:
        logits = logits.masked_fill(torch.arange(shard.columns, device=logits.device) >= shard.valid,
                                    float("-inf"))
    row_max = logits.detach().max(dim=-1, keepdim=True).values
    if shard.group is not None:
        torch.distributed.all_reduce(row_max, op=torch.distributed.ReduceOp.MAX, group=shard.group)
    shifted = logits - row_max
    exp = shifted.exp()
    total = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
    weighted = reduce_from_tensor_model_parallel_region((exp * shifted.nan_to_num(neginf=0.0)).sum(dim=-1))
    return total.log() - weighted / total


def micro_batch_loss(logits: torch.Tensor, batch: MicroBatch, shape: ModelShape, settings: LossSettings,
                     total_tokens: float, total_sequences: float,
                     chunk_tokens: int = 4096) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``logits``: ``[b, s, vocab/TP]`` from the model (``[1, T, vocab/TP]`` for a packed batch); returns (loss,
    weighted statistics)."""
    if settings.temperature != 1.0:
        logits = logits / settings.temperature
    mask = batch.loss_mask
    weights = token_weights(mask, settings.aggregation, total_tokens, total_sequences)
    stats: dict[str, torch.Tensor] = {}
    if settings.entropy_coef:
        entropy = vocab_parallel_entropy(logits.reshape(-1, logits.shape[-1]), shape)
        entropy = to_rows(entropy, batch.tokens, batch.packing)[:, :-1]
        log_probs = position_log_probs(logits, batch.tokens, batch.packing, shape, chunk_tokens)
    else:
        log_probs, entropy = position_log_probs(logits, batch.tokens, batch.packing, shape, chunk_tokens,
                                                with_entropy=True)
    # Padding positions get ratio 1 and zero KL, so nothing non-finite meets a zero weight there.
    valid = mask > 0
    if batch.old_log_probs is None:
        # One optimizer step per rollout (TrainActor.train_rollout): these weights are the old policy, so its
        # log-probs are this forward's own, kept on the batch for the engine mismatch.
        batch.old_log_probs = torch.where(valid, log_probs.detach(), torch.zeros_like(log_probs))
    log_probs = torch.where(valid, log_probs, batch.old_log_probs)
    if settings.policy_loss == "gspo":
        pg_loss, clipped = gspo_policy_loss(log_probs, batch.old_log_probs, batch.advantages, mask, settings.eps_clip,
                                            settings.eps_clip_high)
    elif settings.policy_loss == "cispo":
        pg_loss, clipped = cispo_policy_loss(log_probs, batch.old_log_probs, batch.advantages, settings.eps_clip,
                                             settings.eps_clip_high)
    else:
        pg_loss, clipped = clipped_policy_loss(log_probs, batch.old_log_probs, batch.advantages, settings.eps_clip,
                                               settings.eps_clip_high, settings.eps_clip_c)
    if settings.use_tis:
        tis = rollout_correction_weights(batch.old_log_probs, batch.rollout_log_probs, mask, settings.tis_cap,
                                         settings.tis_level, settings.tis_floor)
        pg_loss = pg_loss * tis
        stats["tis_weight"] = (tis * weights).sum()
        if settings.tis_floor is not None:  # the share of trained tokens the band masked out
            stats["tis_masked"] = ((tis == 0).float() * weights).sum()
    per_token = pg_loss
    if settings.use_kl_loss:
        kl = kl_penalty(log_probs, torch.where(valid, batch.ref_log_probs, log_probs.detach()), settings.kl_loss_type)
        per_token = per_token + settings.kl_loss_coef * kl
        stats["kl"] = (kl.detach() * weights).sum()
    if settings.entropy_coef:
        per_token = per_token - settings.entropy_coef * entropy
    loss = (per_token * weights).sum()
    ratio = torch.exp(log_probs.detach() - batch.old_log_probs)
    stats.update(
        loss=loss.detach(),
        pg_loss=(pg_loss.detach() * weights).sum(),
        entropy=(entropy.detach() * weights).sum(),
        clip_fraction=(clipped * weights).sum(),
        ratio=(ratio * weights).sum(),
        advantage_abs=(batch.advantages.abs() * weights).sum(),
    )
    return loss, stats


def micro_batch_sft_loss(logits: torch.Tensor, batch: MicroBatch, shape: ModelShape, aggregation: str,
                         total_tokens: float, total_sequences: float,
                         chunk_tokens: int = 4096) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SFT: -log p of every trained token (the mask covers assistant turns), weighted as the policy loss is, so
    with ``token_mean`` the step's loss is the mean negative log-likelihood per trained token."""
    weights = token_weights(batch.loss_mask, aggregation, total_tokens, total_sequences)
    log_probs, entropy = position_log_probs(logits, batch.tokens, batch.packing, shape, chunk_tokens,
                                            with_entropy=True)
    loss = -(torch.where(batch.loss_mask > 0, log_probs, 0.0) * weights).sum()
    return loss, {"loss": loss.detach(), "entropy": (entropy.detach() * weights).sum()}


def micro_batch_value_loss(values: torch.Tensor, batch: MicroBatch, aggregation: str, value_clip: float | None,
                           total_tokens: float,
                           total_sequences: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``values``: ``[b, s]`` from the critic (position t values the state before token t+1); returns (loss,
    weighted statistics) with the same step-wide weighting as the policy loss."""
    mask = batch.loss_mask
    weights = token_weights(mask, aggregation, total_tokens, total_sequences)
    values = torch.where(mask > 0, values[:, :-1].float(), batch.old_values)  # padding stays finite
    per_token, clipped = clipped_value_loss(values, batch.old_values, batch.returns, value_clip)
    loss = (per_token * weights).sum()
    return loss, {"value_loss": loss.detach(), "value_clip_fraction": (clipped * weights).sum(),
                  "values": (values.detach() * weights).sum(), "returns": (batch.returns * weights).sum()}
