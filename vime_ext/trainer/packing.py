"""Packed sequences (the THD layout): a micro-batch's sequences end to end in one row, with no padding.

Right-padding a micro-batch to its longest sequence spends attention, MLP and loss FLOPs on padding; RL batches,
whose response lengths vary by 10x, waste much of a padded micro-batch that way. Packed, the model sees one row
of ``sum(lengths)`` tokens; ``cu_seqlens`` tells attention where each sequence starts (nothing attends across a
boundary) and positions restart at 0 for each sequence, so every sequence's logits are those it would get alone.

The model's per-position outputs (log-probs, entropies, values) are scattered back to the padded ``[b, s]``
layout the losses, advantages and statistics use, so only the model call differs between the two layouts.
"""

from dataclasses import dataclass

import torch


@dataclass
class Packing:
    input_ids: torch.Tensor  # [1, T] the sequences end to end (then any alignment padding)
    position_ids: torch.Tensor  # [1, T] each sequence's own positions 0 .. n-1
    cu_seqlens: torch.Tensor  # [segments + 1] int32 segment starts (alignment padding is a segment of its own)
    max_seqlen: int
    # [T] long: each packed token's place (row * width + column) in the padded [rows, width] layout, or
    # rows * width (a slot that is dropped) for alignment padding
    index: torch.Tensor
    rows: int
    width: int

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def to(self, device) -> "Packing":
        return Packing(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()})

    def seq_params(self):
        from megatron.core.packed_seq_params import PackedSeqParams

        return PackedSeqParams(qkv_format="thd", cu_seqlens_q=self.cu_seqlens, cu_seqlens_kv=self.cu_seqlens,
                               max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen)

    def to_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """``[T, ...]`` per packed position -> ``[rows, width, ...]``; positions past a row's end are 0.
        Differentiable."""
        slots = flat.new_zeros((self.rows * self.width + 1, *flat.shape[1:]))
        return slots.index_copy(0, self.index, flat)[:-1].view(self.rows, self.width, *flat.shape[1:])


def pack(tokens: torch.Tensor, lengths: list[int], multiple: int = 1) -> Packing:
    """Pack the right-padded rows ``tokens`` ``[b, s]`` (row i holds ``lengths[i]`` tokens); the packed row is
    padded to a multiple of ``multiple`` tokens (sequence parallelism splits it over TP ranks)."""
    rows, width = tokens.shape
    if len(lengths) != rows or min(lengths, default=0) < 1 or max(lengths, default=0) > width:
        raise ValueError(f"lengths {lengths} do not fit tokens of shape {tuple(tokens.shape)}")
    total = sum(lengths)
    padding = -total % multiple
    index = torch.cat([torch.arange(n) + row * width for row, n in enumerate(lengths)]
                      + [torch.full((padding,), rows * width)])
    ids = torch.cat([tokens.reshape(-1)[index[:total]], tokens.new_zeros(padding)])
    segments = list(lengths) + ([padding] if padding else [])
    positions = torch.cat([torch.arange(n) for n in segments])
    cu_seqlens = torch.tensor([0, *torch.tensor(segments).cumsum(0).tolist()], dtype=torch.int32)
    return Packing(ids[None], positions[None], cu_seqlens, max(segments), index, rows, width)


def model_inputs(tokens: torch.Tensor, packing: Packing | None) -> dict:
    """Keyword arguments for ``GPTModel.forward`` (right-padded rows, or their packing)."""
    if packing is None:
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)
        return {"input_ids": tokens, "position_ids": positions, "attention_mask": None}
    return {"input_ids": packing.input_ids, "position_ids": packing.position_ids, "attention_mask": None,
            "packed_seq_params": packing.seq_params()}


def next_tokens(tokens: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    """The token after each model position, flat (``[b * s]`` padded, ``[T]`` packed): the targets of log-probs.
    After a sequence's last token it is whatever follows (padding, the next sequence); those positions are never
    scored."""
    ids = tokens if packing is None else packing.input_ids
    return torch.cat([ids[:, 1:], ids.new_zeros(ids.shape[0], 1)], dim=1).reshape(-1)


def to_rows(flat: torch.Tensor, tokens: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    """Per-position values ``[N, ...]`` (``N`` as in ``next_tokens``) -> ``[b, s, ...]`` padded rows."""
    if packing is None:
        return flat.view(*tokens.shape, *flat.shape[1:])
    return packing.to_rows(flat)
