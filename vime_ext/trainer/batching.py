"""Training sequences -> data-parallel shards -> micro-batches.

A micro-batch's per-token data is right-padded to its longest sequence (causal attention never looks right, so
padding changes nothing before it); packed (``packing.py``), the model itself sees the sequences end to end
without padding. Micro-batches hold ``micro_batch_size`` sequences, or, with a token budget, as many
length-sorted sequences as fit in ``max_tokens`` tokens: the sum of their lengths when packed, rows x the longest
when padded.
"""

from dataclasses import dataclass

import torch

from vime_ext.algorithms.train_data import TrainSequence
from vime_ext.trainer.packing import Packing, pack


@dataclass
class MicroBatch:
    tokens: torch.Tensor  # [b, s] long, right-padded with 0
    loss_mask: torch.Tensor  # [b, s-1] float, aligned with tokens[:, 1:]
    advantages: torch.Tensor  # [b, s-1]
    rollout_log_probs: torch.Tensor  # [b, s-1]
    rewards: torch.Tensor  # [b] each row's scalar reward (NaN where the converter gave none)
    old_log_probs: torch.Tensor | None = None  # a forward-only pass before training, or the one step's own forward
    ref_log_probs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None  # PPO: the critic's values before this rollout's updates
    returns: torch.Tensor | None = None  # PPO: GAE's value targets
    rows: list[int] | None = None  # which sequences (indices into the list given to micro_batches) the rows are
    packing: Packing | None = None  # set: the model gets the rows packed end to end

    @property
    def num_tokens(self) -> int:
        """Tokens the model processes."""
        return self.tokens.numel() if self.packing is None else self.packing.num_tokens

    def to(self, device) -> "MicroBatch":
        moved = {k: (v.to(device) if isinstance(v, (torch.Tensor, Packing)) else v) for k, v in vars(self).items()}
        return MicroBatch(**moved)


def collate(sequences: list[TrainSequence], pack_multiple: int | None = None) -> MicroBatch:
    """Right-padded rows of ``sequences``; with ``pack_multiple``, also their packing, padded to a multiple of
    that many tokens."""
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
    packing = None if pack_multiple is None else pack(tokens, [len(s.tokens) for s in sequences], pack_multiple)
    return MicroBatch(tokens, mask, advantages * mask, log_probs * mask, rewards, packing=packing)


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
                  first_row: int = 0, budget_flag: str = "--max-tokens-per-gpu",
                  pack_multiple: int | None = None) -> list[MicroBatch]:
    """Batches of ``micro_batch_size`` sequences, or of length-sorted sequences within ``max_tokens`` tokens;
    each batch's ``rows`` are its sequences' indices in ``sequences``, plus ``first_row``. With
    ``pack_multiple`` the batches are packed (see ``collate``) and the budget counts packed tokens."""
    if not sequences:
        return []
    order = list(range(len(sequences)))
    if max_tokens is None:
        groups = [order[i:i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]
    else:
        longest = max(len(s.tokens) for s in sequences)
        if longest > max_tokens:
            raise ValueError(f"a sequence of {longest} tokens exceeds {budget_flag} {max_tokens}")

        def cost(lengths: list[int]) -> int:
            if pack_multiple is None:
                return max(lengths) * len(lengths)
            return sum(lengths) + -sum(lengths) % pack_multiple

        groups, current = [], []
        for i in sorted(order, key=lambda i: len(sequences[i].tokens)):
            if current and cost([len(sequences[j].tokens) for j in current + [i]]) > max_tokens:
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
    batches = []
    for group in groups:
        batch = collate([sequences[i] for i in group], pack_multiple)
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
