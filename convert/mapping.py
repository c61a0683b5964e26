"""HF <-> Megatron (megatron-core GPTModel) weight mapping shared by every dense decoder family.

Each family file (``qwen3.py``, ``qwen2.py``, ``llama.py``) states which optional tensors it has; the tensor
layouts themselves are common:
- ``linear_qkv`` fuses q, k and v per query group: for each KV head g, the rows are
  [q heads of g | k_g | v_g], so a TP split along rows hands whole groups to each rank.
- ``linear_fc1`` stacks [gate; up]; under TP every rank holds [gate shard; up shard].
- Vocab rows are padded to a multiple of TP; padding rows are zero and never leave the mapping.
Names are the local layer spec's; Transformer Engine's fused-norm names are folded into them by ``canonical``.
"""

import re
from dataclasses import dataclass

import torch

from vime_ext.models.model_config import ModelShape

_TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Family:
    """What distinguishes one dense decoder family's weights from another's."""

    name: str
    qkv_bias: bool = False
    qk_norm: bool = False

    def layer_params(self) -> dict[str, list[str]]:
        """Megatron per-layer param suffix -> the HF per-layer suffixes it is made of."""
        params = {
            "input_layernorm.weight": ["input_layernorm.weight"],
            "self_attention.linear_qkv.weight": ["self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                 "self_attn.v_proj.weight"],
            "self_attention.linear_proj.weight": ["self_attn.o_proj.weight"],
            "pre_mlp_layernorm.weight": ["post_attention_layernorm.weight"],
            "mlp.linear_fc1.weight": ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
            "mlp.linear_fc2.weight": ["mlp.down_proj.weight"],
        }
        if self.qkv_bias:
            params["self_attention.linear_qkv.bias"] = ["self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                                        "self_attn.v_proj.bias"]
        if self.qk_norm:
            params["self_attention.q_layernorm.weight"] = ["self_attn.q_norm.weight"]
            params["self_attention.k_layernorm.weight"] = ["self_attn.k_norm.weight"]
        return params


def canonical(megatron_name: str) -> str:
    """Fold TE spec names (norms fused into the following linear) into local spec names."""
    match = _LAYER.match(megatron_name)
    if match and match.group(2) in _TE_ALIASES:
        return f"decoder.layers.{match.group(1)}.{_TE_ALIASES[match.group(2)]}"
    return megatron_name


class WeightMapping:
    """Full (TP-unsharded) tensors between the two naming schemes, plus TP sharding and gathering."""

    def __init__(self, family: Family, shape: ModelShape):
        if family.name != shape.family:
            raise ValueError(f"mapping for {family.name!r} used with a {shape.family!r} model")
        self.family = family
        self.shape = shape
        self._layer_params = family.layer_params()

    # ---- names -----------------------------------------------------------------------------------------
    def megatron_names(self) -> list[str]:
        """Every Megatron param of the whole model (all layers, all stages), canonical names."""
        names = ["embedding.word_embeddings.weight"]
        for layer in range(self.shape.num_layers):
            names += [f"decoder.layers.{layer}.{suffix}" for suffix in self._layer_params]
        names.append("decoder.final_layernorm.weight")
        if not self.shape.tie_word_embeddings:
            names.append("output_layer.weight")
        return names

    def hf_names(self, megatron_name: str) -> list[str]:
        name = canonical(megatron_name)
        match = _LAYER.match(name)
        if match:
            layer, suffix = match.groups()
            if suffix not in self._layer_params:
                raise KeyError(f"no HF counterpart for Megatron param {megatron_name!r}")
            return [f"model.layers.{layer}.{hf}" for hf in self._layer_params[suffix]]
        top = {
            "embedding.word_embeddings.weight": ["model.embed_tokens.weight"],
            "decoder.final_layernorm.weight": ["model.norm.weight"],
            "output_layer.weight": ["lm_head.weight"],
        }
        if name not in top:
            raise KeyError(f"no HF counterpart for Megatron param {megatron_name!r}")
        return top[name]

    def hf_param_names(self) -> list[str]:
        return [hf for name in self.megatron_names() for hf in self.hf_names(name)]

    # ---- full tensors ----------------------------------------------------------------------------------
    def to_megatron(self, megatron_name: str, hf_tensors: list[torch.Tensor], padded_vocab: int) -> torch.Tensor:
        """Combine the HF tensors named by ``hf_names`` into the full Megatron tensor."""
        name = canonical(megatron_name)
        if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
            return self._fuse_qkv(*hf_tensors)
        if name.endswith("linear_fc1.weight"):
            return torch.cat(hf_tensors, dim=0)
        (tensor,) = hf_tensors
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            pad = padded_vocab - tensor.shape[0]
            return torch.cat([tensor, tensor.new_zeros(pad, tensor.shape[1])]) if pad else tensor
        return tensor

    def to_hf(self, megatron_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """Split a full Megatron tensor into its HF tensors."""
        name = canonical(megatron_name)
        hf = self.hf_names(name)
        if name.endswith("linear_qkv.weight") or name.endswith("linear_qkv.bias"):
            return list(zip(hf, self._split_qkv(tensor)))
        if name.endswith("linear_fc1.weight"):
            return list(zip(hf, tensor.chunk(2, dim=0)))
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            tensor = tensor[: self.shape.vocab_size]
        return [(hf[0], tensor)]

    def _fuse_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        groups, d = self.shape.num_query_groups, self.shape.head_dim
        rest = q.shape[1:]
        q = q.reshape(groups, -1, *rest)
        k = k.reshape(groups, d, *rest)
        v = v.reshape(groups, d, *rest)
        return torch.cat([q, k, v], dim=1).reshape(-1, *rest)

    def _split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        groups, d = self.shape.num_query_groups, self.shape.head_dim
        q_per_group = self.shape.num_attention_heads // groups * d
        rest = qkv.shape[1:]
        grouped = qkv.reshape(groups, q_per_group + 2 * d, *rest)
        q, k, v = grouped.split([q_per_group, d, d], dim=1)
        return (q.reshape(-1, *rest).contiguous(), k.reshape(-1, *rest).contiguous(),
                v.reshape(-1, *rest).contiguous())

    # ---- tensor parallel -------------------------------------------------------------------------------
    @staticmethod
    def shard(megatron_name: str, full: torch.Tensor, param: torch.Tensor, tp_size: int,
              tp_rank: int) -> torch.Tensor:
        """This rank's slice of a full tensor, for the live ``param`` it will be copied into."""
        if tp_size == 1 or not getattr(param, "tensor_model_parallel", False):
            return full
        dim = param.partition_dim
        if canonical(megatron_name).endswith("linear_fc1.weight"):
            gate, up = full.chunk(2, dim=0)
            return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]])
        return full.chunk(tp_size, dim=dim)[tp_rank]

    @staticmethod
    def unshard(megatron_name: str, shards: list[torch.Tensor], param: torch.Tensor) -> torch.Tensor:
        """Inverse of ``shard``: the full tensor from every TP rank's slice, in rank order."""
        if len(shards) == 1 or not getattr(param, "tensor_model_parallel", False):
            return shards[0]
        if canonical(megatron_name).endswith("linear_fc1.weight"):
            halves = [s.chunk(2, dim=0) for s in shards]
            return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        return torch.cat(shards, dim=param.partition_dim)


def global_param_name(local_name: str, layer_offset: int) -> str:
    """A stage-local param name with its layer index made global (pipeline stages number layers from 0)."""
    match = _LAYER.match(local_name)
    if not match or not layer_offset:
        return local_name
    return f"decoder.layers.{int(match.group(1)) + layer_offset}.{match.group(2)}"
