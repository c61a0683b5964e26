"""PPO's critic: the policy's architecture with a scalar value head, on the same ranks and layout as the actor.

The critic starts from the policy's HF weights (or ``--critic-load``) with a zero value head, so its first values
are 0 and its first updates move only the head. It is saved inside the actor's checkpoint directory
(``iter_N/critic/``), so one atomic save covers both.
"""

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from vime_ext.trainer.batching import MicroBatch
from vime_ext.trainer.forward import forward_backward, run_forward
from vime_ext.trainer.model_provider import unwrap
from vime_ext.trainer.optimizer import ActorOptimizer
from vime_ext.trainer.packing import to_rows
from vime_ext.trainer.rl_loss import micro_batch_value_loss

if TYPE_CHECKING:
    from vime_ext.trainer.megatron_optimizer import MegatronAdamW

CRITIC_DIR = "critic"


class ValueHead(torch.nn.Module):
    """Takes the output layer's place: hidden ``[s, b, h]`` -> values ``[s, b, 1]``. Replicated over TP; every
    TP rank sees the whole hidden state, so its gradient is complete on each rank without a TP reduction."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype, device=device))

    def forward(self, hidden_states: torch.Tensor, weight=None, runtime_gather_output=None):
        # Same call signature as megatron's ColumnParallelLinear output layer, which GPTModel calls.
        return F.linear(hidden_states, self.weight), None


def attach_value_head(model: torch.nn.Module) -> torch.nn.Module:
    """Turn a GPTModel (any stage) into a critic: the last stage's output layer becomes a ``ValueHead``, and no
    stage ties embeddings to it any more."""
    from megatron.core import parallel_state

    gpt = unwrap(model)
    if parallel_state.is_pipeline_last_stage():
        reference = gpt.decoder.final_layernorm.weight
        gpt.output_layer = ValueHead(gpt.config.hidden_size, reference.dtype, reference.device)
    gpt.share_embeddings_and_output_weights = False
    return model


def critic_checkpoint_dir(path: str | Path) -> Path:
    """The critic of a PPO checkpoint (its save directory, an iter_* directory, or the critic directory)."""
    from vime_ext.trainer.checkpoint import CheckpointError, checkpoint_common_state, resolve_checkpoint_dir

    resolved = resolve_checkpoint_dir(path)
    if (resolved / CRITIC_DIR).is_dir():
        resolved = resolve_checkpoint_dir(resolved / CRITIC_DIR)
    if not checkpoint_common_state(resolved).get("vime_ext", {}).get("critic"):
        raise CheckpointError(f"{resolved}: no critic here (no '{CRITIC_DIR}/' directory); was it saved by a PPO "
                              "run (--advantage-estimator ppo)?")
    return resolved


class Critic:
    """The critic model (``optimizer.model``), its optimizer, and its two passes per rollout: old values, then
    value-loss updates."""

    def __init__(self, optimizer: "ActorOptimizer | MegatronAdamW", aggregation: str, value_clip: float | None):
        self.model, self.optimizer = optimizer.model, optimizer
        self.aggregation, self.value_clip = aggregation, value_clip

    @torch.no_grad()
    def fill_values(self, batches: list[MicroBatch]) -> None:
        """``batch.old_values`` (``[b, s-1]``, aligned with the loss mask) on the last stage, forward only."""
        for batch in batches:
            collected: list[torch.Tensor] = []
            run_forward(self.model, batch.tokens, collected.append, batch.packing)
            if collected:
                batch.old_values = self.values(collected[0], batch)[:, :-1].float()

    @staticmethod
    def values(output: torch.Tensor, batch: MicroBatch) -> torch.Tensor:
        """The value head's output (``[b, s, 1]``, or ``[1, T, 1]`` packed) as ``[b, s]`` rows."""
        return to_rows(output.reshape(-1), batch.tokens, batch.packing)

    def train_step(self, batches: list[MicroBatch], total_tokens: float, total_sequences: float) -> dict:
        """One optimizer step on the value loss; returns weighted statistic sums (last stage) and the
        optimizer's ``critic_*`` figures."""
        def loss_fn(output: torch.Tensor, batch: MicroBatch):
            return micro_batch_value_loss(self.values(output, batch), batch, self.aggregation, self.value_clip,
                                          total_tokens, total_sequences)

        stats = forward_backward(self.model, batches, loss_fn)
        return {**stats, **{f"critic_{k}": v for k, v in self.optimizer.step().items()}}
