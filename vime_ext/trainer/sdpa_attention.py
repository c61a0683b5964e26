"""Core attention through ``torch.nn.functional.scaled_dot_product_attention``, for CUDA without Transformer
Engine.

megatron-core's local ``DotProductAttention`` materialises the [batch x heads x seq x seq] score matrix (it ran
out of memory at 8192 tokens for a 4B model on an 80 GB GPU); SDPA dispatches to flash / memory-efficient
kernels that never do, and handles grouped-query attention itself. It drops into the local layer spec in place
of ``DotProductAttention`` (same constructor and forward), so weights, checkpoints and conversion are unchanged.

Packed sequences (THD, ``packing.py``) go through torch's variable-length flash attention where this torch has it
on CUDA (one kernel for the whole pack; its boundaries stay on the device), else through one SDPA call per
sequence.
"""

import functools
import inspect
import math

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule


class SDPAAttention(MegatronModule):
    def __init__(self, config, layer_number: int, attn_mask_type: AttnMaskType, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAAttention does not do context parallelism; use Transformer Engine layers")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError(f"SDPAAttention supports the vanilla softmax only, not {config.softmax_type!r}")
        tp = pg_collection.tp.size() if pg_collection is not None else \
            parallel_state.get_tensor_model_parallel_world_size()
        self.hidden_size_per_partition = config.kv_channels * config.num_attention_heads // tp
        # With apply_query_key_layer_scaling megatron divides the scale by the layer number and multiplies it
        # back inside its fp32 softmax: the product is the plain scale, which is what SDPA gets.
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.attn_mask_type = attn_mask_type
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params=None) -> torch.Tensor:
        """query [sq, b, heads, d], key/value [sk, b, groups, d] -> context [sq, b, heads * d]; packed, query
        [t, heads, d], key/value [t, groups, d] -> context [t, heads * d]."""
        if attention_bias is not None:
            raise NotImplementedError("SDPAAttention takes no attention bias")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if packed_seq_params is not None:
            if packed_seq_params.qkv_format != "thd" or attention_mask is not None or \
                    mask_type != AttnMaskType.causal:
                raise NotImplementedError("SDPAAttention packs causal THD sequences only")
            return self._packed(query, key, value, packed_seq_params)
        sq, batch = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        causal = attention_mask is None and mask_type == AttnMaskType.causal
        # megatron's masks are True where attention is *not* allowed; SDPA's boolean masks the opposite.
        mask = None if attention_mask is None else ~attention_mask
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale,
                                                 dropout_p=self.dropout if self.training else 0.0,
                                                 enable_gqa=k.shape[1] != q.shape[1])
        return context.permute(2, 0, 1, 3).reshape(sq, batch, self.hidden_size_per_partition)

    def _packed(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, params) -> torch.Tensor:
        dropout = self.dropout if self.training else 0.0
        # Flash kernels take half precision only; fp32 (the parity tests) goes sequence by sequence.
        if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and dropout == 0.0 and \
                _varlen_attn() is not None:
            context = _varlen_attn()(query, key, value, params.cu_seqlens_q, params.cu_seqlens_kv,
                                     params.max_seqlen_q, params.max_seqlen_kv, self.scale)
        else:
            starts = params.cu_seqlens_q.tolist()
            if params.cu_seqlens_kv.tolist() != starts:
                raise NotImplementedError("SDPAAttention packs self-attention (equal query and key boundaries)")
            context = torch.empty_like(query)
            for start, end in zip(starts[:-1], starts[1:]):
                q, k, v = (t[start:end].transpose(0, 1)[None] for t in (query, key, value))  # [1, heads, n, d]
                context[start:end] = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=self.scale, dropout_p=dropout,
                    enable_gqa=k.shape[1] != q.shape[1])[0].transpose(0, 1)
        return context.reshape(query.shape[0], self.hidden_size_per_partition)


@functools.cache
def _varlen_attn():
    """Causal variable-length flash attention ``(q, k, v, cu_q, cu_k, max_q, max_k, scale) -> out`` from
    ``torch.nn.attention.varlen`` (CUDA), or None where this torch lacks it. Its keywords differ between
    releases (causality as ``is_causal`` or as ``window_size=(-1, 0)``, the latter in 2.11 and 2.13;
    ``enable_gqa`` in 2.13, not 2.11), so they are read off its signature."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    accepted = inspect.signature(varlen_attn).parameters
    fixed = {"is_causal": True} if "is_causal" in accepted else {"window_size": (-1, 0)}

    def attend(q, k, v, cu_q, cu_k, max_q, max_k, scale):
        extra = dict(fixed)
        if "scale" in accepted:
            extra["scale"] = scale
        elif not math.isclose(scale, q.shape[-1] ** -0.5):
            raise NotImplementedError(f"this torch's varlen_attn has no scale argument; scale {scale} is not the "
                                      "default 1/sqrt(head_dim)")
        if k.shape[1] != q.shape[1] and "enable_gqa" in accepted:
            # Newer wrappers check head counts unless told; torch 2.11's passes grouped k/v to the flash kernel,
            # which takes them as they are (on an H100: the same output and gradients as repeated heads).
            extra["enable_gqa"] = True
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **extra)

    return attend
