"""Rotary position embedding in one Triton kernel each way, for CUDA without Transformer Engine.

megatron-core's unfused RoPE (``rope_utils._apply_rotary_pos_emb_bshd``) runs about seven elementwise kernels over
each query and key tensor (split, negate, concatenate, two products, a sum, a final concatenate), each reading and
writing the whole tensor, forward and again backward. Here each row of ``head_dim`` values is read once and
written once, with cos/sin computed in registers from megatron's fp32 angles.

megatron-core calls ``rope_utils.fused_apply_rotary_pos_emb`` (``..._thd`` for packed sequences) when
``config.apply_rope_fusion`` is set, slots Transformer Engine fills when it is installed; ``install()`` fills them
with this kernel when TE has not. Packed, each token's angle row is picked by its position within its own
sequence, on the device (megatron's unfused THD code splits the pack on the host, a GPU sync per call). Only the
rotate-half layout (every Qwen/Llama model here) is fused; other layouts fall back to megatron's own code.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_rows(x_ptr, freqs_ptr, out_ptr, rows_per_position, head_dim: tl.constexpr, rot_dim: tl.constexpr,
               BLOCK: tl.constexpr, BACKWARD: tl.constexpr):
    # One program per (position, batch, head) row of a contiguous [s, b, h, d] tensor.
    row = tl.program_id(0)
    position = row // rows_per_position
    i = tl.arange(0, BLOCK)
    half: tl.constexpr = rot_dim // 2
    in_row = i < head_dim
    rotated = i < rot_dim
    partner = tl.where(i < half, i + half, i - half)
    x = tl.load(x_ptr + row * head_dim + i, mask=in_row, other=0.0).to(tl.float32)
    x_partner = tl.load(x_ptr + row * head_dim + partner, mask=rotated, other=0.0).to(tl.float32)
    angle = tl.load(freqs_ptr + position * rot_dim + i, mask=rotated, other=0.0)
    if BACKWARD:
        # d out[k] / d x[j]: cos on the diagonal; the partner's sin, with the sign flipped relative to forward.
        angle_partner = tl.load(freqs_ptr + position * rot_dim + partner, mask=rotated, other=0.0)
        out = x * tl.cos(angle) + tl.where(i < half, x_partner, -x_partner) * tl.sin(angle_partner)
    else:
        out = x * tl.cos(angle) + tl.where(i < half, -x_partner, x_partner) * tl.sin(angle)
    out = tl.where(rotated, out, x)  # dims past rot_dim pass through
    tl.store(out_ptr + row * head_dim + i, out.to(out_ptr.dtype.element_ty), mask=in_row)


def _launch(x: torch.Tensor, angles: torch.Tensor, backward: bool) -> torch.Tensor:
    """``x`` ``[s, b, h, d]``, ``angles`` ``[s, rot_dim]`` fp32 (row i for position i of x)."""
    x = x.contiguous()
    seq, batch, heads, head_dim = x.shape
    out = torch.empty_like(x)
    _rope_rows[(seq * batch * heads,)](x, angles, out, batch * heads, head_dim, angles.shape[-1],
                                       BLOCK=triton.next_power_of_2(head_dim), BACKWARD=backward)
    return out


class _FusedRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(angles)
        return _launch(x, angles, backward=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (angles,) = ctx.saved_tensors
        return _launch(grad, angles, backward=True), None


def _rotate_half_layout(freqs: torch.Tensor, interleaved: bool) -> bool:
    return not interleaved and freqs.dim() == 4 and freqs.shape[1] == 1 and freqs.shape[2] == 1 and \
        freqs.shape[-1] % 2 == 0


def fused_rope(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False, **_) -> torch.Tensor:
    """RoPE on ``t`` ``[s, b, h, d]`` with megatron's angles ``freqs`` ``[>=s, 1, 1, rot_dim]`` (fp32), as
    megatron's ``fused_apply_rotary_pos_emb`` is called."""
    if not _rotate_half_layout(freqs, interleaved):
        from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

        return _apply_rotary_pos_emb_bshd(t, freqs[: t.shape[0]], rotary_interleaved=interleaved)
    seq = t.shape[0]
    return _FusedRope.apply(t, freqs[:seq].reshape(seq, -1).float().contiguous())


def fused_rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1,
                   cp_rank: int = 0, interleaved: bool = False, **_) -> torch.Tensor:
    """RoPE on packed ``t`` ``[T, h, d]`` whose sequences start at ``cu_seqlens``, each at position 0, as
    megatron's ``fused_apply_rotary_pos_emb_thd`` is called."""
    if cp_size != 1 or not _rotate_half_layout(freqs, interleaved):
        from megatron.core import parallel_state
        from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_thd

        return _apply_rotary_pos_emb_thd(t, cu_seqlens, freqs, rotary_interleaved=interleaved,
                                         cp_group=parallel_state.get_context_parallel_group())
    return _FusedRope.apply(t.unsqueeze(1), _packed_angles(cu_seqlens, freqs, t.shape[0])).squeeze(1)


_last_angles: list = []  # [(cu_seqlens, freqs, tokens), angles] of the latest call


def _packed_angles(cu_seqlens: torch.Tensor, freqs: torch.Tensor, tokens: int) -> torch.Tensor:
    """Each packed token's angle row ``[T, rot_dim]``. Every layer's query and key of one forward pass get the
    same ``cu_seqlens`` and ``freqs`` tensors, so the table is built once per pass, not 2 x layers times (small
    kernels whose launches a small model's pass is bound by)."""
    if _last_angles:
        (last_cu, last_freqs, last_tokens), angles = _last_angles
        if last_cu is cu_seqlens and last_freqs is freqs and last_tokens == tokens:
            return angles
    index = torch.arange(tokens, device=freqs.device)
    cu = cu_seqlens.long()
    positions = index - cu[torch.searchsorted(cu[1:], index, right=True)]
    angles = freqs.reshape(freqs.shape[0], -1).float().index_select(0, positions)
    _last_angles[:] = [(cu_seqlens, freqs, tokens), angles]
    return angles


def install() -> bool:
    """Fill megatron-core's fused-RoPE slots with ``fused_rope`` / ``fused_rope_thd`` unless Transformer Engine
    already has; returns whether a fused RoPE is now available (set ``apply_rope_fusion`` in the config only
    then)."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = fused_rope
    if rope_utils.fused_apply_rotary_pos_emb_thd is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = fused_rope_thd
    return rope_utils.fused_apply_rotary_pos_emb is not None
