"""Training sequences -> data-parallel shards -> padded micro-batches.

Sequences are right-padded to the longest one in their micro-batch (causal attention never looks right, so
padding changes nothing before it). Micro-batches hold ``micro_batch_size`` sequences, or, with a token budget,
as many length-sorted sequences as fit in ``max_tokens`` padded tokens.
"""

from dataclasses import dataclass

import torch

from vime_ext.algorithms.train_data import TrainSequence


@dataclass
class MicroBatch:
    tokens: torch.Tensor  # [b, s] long, right-padded with 0
    loss_mask: torch.Tensor  # [b, s-1] float, aligned with tokens[:, 1:]
    advantages: torch.Tensor  # [b, s-1]
    rollout_log_probs: torch.Tensor  # [b, s-1]
    rewards: torch.Tensor  # [b] each row's scalar reward (NaN where the converter gave none)
    old_log_probs: torch.Tensor | None = None  # filled by a forward-only pass before training
    ref_log_probs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None  # PPO: the critic's values before this rollout's updates
    returns: torch.Tensor | None = None  # PPO: GAE's value targets

    @property
    def num_tokens(self) -> int:
        return self.tokens.numel()

    def to(self, device) -> "MicroBatch":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        return MicroBatch(**moved)


def collate(sequences: list[TrainSequence]) -> MicroBatch:
    width = max(len(s.tokens) for s in sequences)
    batch = len(sequences)
    tokens = torch.zeros(batch, width, dtype=torch.long)
    mask, advantages, log_probs = (torch.zeros(batch, width - 1) for _ in range(3))
    for row, seq in enumerate(sequences):
        n = len(seq.tokens)
        tokens[row, :n] = torch.tensor(seq.tokens)
        mask[row, :n - 1] = torch.tensor(seq.loss_mask, dtype=torch.float32)
        advantages[row, :n - 1] = seq.advantage
        log_probs[row, :n - 1] = torch.tensor(seq.rollout_log_probs, dtype=torch.float32)
    rewards = torch.tensor([float("nan") if s.reward is None else s.reward for s in sequences])
    return MicroBatch(tokens, mask, advantages * mask, log_probs * mask, rewards)


def split_data_parallel(sequences: list[TrainSequence], dp_size: int) -> list[list[TrainSequence]]:
    """Deal sequences to ranks, longest first to the least-loaded rank, so ranks do similar work; each rank
    keeps its sequences in their original order."""
    loads = [0] * dp_size
    owner = {}
    for i in sorted(range(len(sequences)), key=lambda i: -len(sequences[i].tokens)):
        rank = min(range(dp_size), key=lambda r: loads[r])
        owner[i] = rank
        loads[rank] += len(sequences[i].tokens)
    return [[s for i, s in enumerate(sequences) if owner[i] == r] for r in range(dp_size)]


def micro_batches(sequences: list[TrainSequence], micro_batch_size: int = 1,
                  max_tokens: int | None = None) -> list[MicroBatch]:
    if not sequences:
        return []
    if max_tokens is None:
        groups = [sequences[i:i + micro_batch_size] for i in range(0, len(sequences), micro_batch_size)]
    else:
        longest = max(len(s.tokens) for s in sequences)
        if longest > max_tokens:
            raise ValueError(f"a sequence of {longest} tokens exceeds --max-tokens-per-gpu {max_tokens}")
        groups, current = [], []
        for seq in sorted(sequences, key=lambda s: len(s.tokens)):
            width = max([len(seq.tokens)] + [len(s.tokens) for s in current])
            if current and width * (len(current) + 1) > max_tokens:
                groups.append(current)
                current = []
            current.append(seq)
        groups.append(current)
    return [collate(g) for g in groups]
