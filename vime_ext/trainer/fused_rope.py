"""Rotary position embedding in one Triton kernel each way, for CUDA without Transformer Engine.

megatron-core's unfused RoPE (``rope_utils._apply_rotary_pos_emb_bshd``) runs about seven elementwise kernels over
each query and key tensor (split, negate, concatenate, two products, a sum, a final concatenate), each reading and
writing the whole tensor, forward and again backward. Here each row of ``head_dim`` values is read once and
written once, with cos/sin computed in registers from megatron's fp32 angles.

megatron-core calls ``rope_utils.fused_apply_rotary_pos_emb`` when ``config.apply_rope_fusion`` is set, a slot
Transformer Engine fills when it is installed; ``install()`` fills it with this kernel when TE has not. Only the
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


def _launch(x: torch.Tensor, freqs: torch.Tensor, backward: bool) -> torch.Tensor:
    x = x.contiguous()
    seq, batch, heads, head_dim = x.shape
    rot_dim = freqs.shape[-1]
    angles = freqs[:seq].reshape(seq, rot_dim).float().contiguous()
    out = torch.empty_like(x)
    _rope_rows[(seq * batch * heads,)](x, angles, out, batch * heads, head_dim, rot_dim,
                                       BLOCK=triton.next_power_of_2(head_dim), BACKWARD=backward)
    return out


class _FusedRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(freqs)
        return _launch(x, freqs, backward=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (freqs,) = ctx.saved_tensors
        return _launch(grad, freqs, backward=True), None


def fused_rope(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False, **_) -> torch.Tensor:
    """RoPE on ``t`` ``[s, b, h, d]`` with megatron's angles ``freqs`` ``[>=s, 1, 1, rot_dim]`` (fp32), as
    megatron's ``fused_apply_rotary_pos_emb`` is called."""
    if interleaved or freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1 or freqs.shape[-1] % 2:
        from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

        return _apply_rotary_pos_emb_bshd(t, freqs[: t.shape[0]], rotary_interleaved=interleaved)
    return _FusedRope.apply(t, freqs)


def install() -> bool:
    """Fill megatron-core's fused-RoPE slot with ``fused_rope`` unless Transformer Engine already has; returns
    whether a fused RoPE is now available (set ``apply_rope_fusion`` in the config only then)."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = fused_rope
    return rope_utils.fused_apply_rotary_pos_emb is not None
