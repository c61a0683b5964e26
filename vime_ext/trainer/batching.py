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
    rows: list[int] | None = None  # which sequences (indices into the list given to micro_batches) the rows are

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


def micro_batches(sequences: list[TrainSequence], micro_batch_size: int = 1, max_tokens: int | None = None,
                  first_row: int = 0, budget_flag: str = "--max-tokens-per-gpu") -> list[MicroBatch]:
    """Batches of ``micro_batch_size`` sequences, or of length-sorted sequences within ``max_tokens`` padded
    tokens; each batch's ``rows`` are its sequences' indices in ``sequences``, plus ``first_row``."""
    if not sequences:
        return []
    order = list(range(len(sequences)))
    if max_tokens is None:
        groups = [order[i:i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]
    else:
        longest = max(len(s.tokens) for s in sequences)
        if longest > max_tokens:
            raise ValueError(f"a sequence of {longest} tokens exceeds {budget_flag} {max_tokens}")
        groups, current, width = [], [], 0
        for i in sorted(order, key=lambda i: len(sequences[i].tokens)):
            if current and max(width, len(sequences[i].tokens)) * (len(current) + 1) > max_tokens:
                groups.append(current)
                current, width = [], 0
            current.append(i)
            width = max(width, len(sequences[i].tokens))
        groups.append(current)
    batches = []
    for group in groups:
        batch = collate([sequences[i] for i in group])
        batch.rows = [first_row + i for i in group]
        batches.append(batch)
    return batches


def copy_rows(sources: list[MicroBatch], targets: list[MicroBatch], fields: tuple[str, ...]) -> None:
    """Fill ``fields`` (``[b, s-1]`` per-token tensors) of ``targets`` from ``sources`` holding the same
    sequences batched differently, matched by ``rows``; positions past a sequence's end are 0."""
    where = {i: (batch, r) for batch in sources for r, i in enumerate(batch.rows)}
    for field in fields:
        if getattr(sources[0], field) is None:
            continue
        for target in targets:
            out = torch.zeros_like(target.loss_mask)
            for r, i in enumerate(target.rows):
                batch, source_row = where[i]
                values = getattr(batch, field)[source_row]
                width = min(out.shape[1], values.shape[0])  # both cover the sequence; the rest is padding
                out[r, :width] = values[:width]
            setattr(target, field, out)
