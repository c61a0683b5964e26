"""Core attention through ``torch.nn.functional.scaled_dot_product_attention``, for CUDA without Transformer
Engine.

megatron-core's local ``DotProductAttention`` materialises the [batch x heads x seq x seq] score matrix (it ran
out of memory at 8192 tokens for a 4B model on an 80 GB GPU); SDPA dispatches to flash / memory-efficient
kernels that never do, and handles grouped-query attention itself. It drops into the local layer spec in place
of ``DotProductAttention`` (same constructor and forward), so weights, checkpoints and conversion are unchanged.
"""

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
        """query [sq, b, heads, d], key/value [sk, b, groups, d] -> context [sq, b, heads * d]."""
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPAAttention takes padded batches without attention bias; packed (THD) "
                                      "sequences need Transformer Engine layers")
        sq, batch = query.shape[0], query.shape[1]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = attention_mask is None and mask_type == AttnMaskType.causal
        # megatron's masks are True where attention is *not* allowed; SDPA's boolean masks the opposite.
        mask = None if attention_mask is None else ~attention_mask
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale,
                                                 dropout_p=self.dropout if self.training else 0.0,
                                                 enable_gqa=k.shape[1] != q.shape[1])
        return context.permute(2, 0, 1, 3).reshape(sq, batch, self.hidden_size_per_partition)
