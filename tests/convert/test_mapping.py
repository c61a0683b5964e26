"""The HF <-> Megatron tensor layouts on hand-made tensors whose values say where they came from."""

import pytest
import torch

from vime_ext.convert import mapping_for
from vime_ext.convert.mapping import canonical, global_param_name
from vime_ext.models.model_config import ModelShape


def _shape(**overrides) -> ModelShape:
    fields = dict(family="qwen2", num_layers=2, hidden_size=8, ffn_hidden_size=6, num_attention_heads=4,
                  num_query_groups=2, head_dim=2, vocab_size=10, max_position_embeddings=32, rope_theta=1e4,
                  norm_eps=1e-6, tie_word_embeddings=False, qkv_bias=True, qk_layernorm=False)
    return ModelShape(**{**fields, **overrides})


def _tp_param(shape, dim):
    p = torch.nn.Parameter(torch.empty(shape))
    p.tensor_model_parallel, p.partition_dim = True, dim
    return p


def test_qkv_is_fused_per_query_group():
    shape = _shape()
    mapping = mapping_for(shape)
    # Row r of q/k/v holds value 100*which + r, so the fused row order is readable.
    q = torch.arange(8).float().unsqueeze(1) + 100
    k = torch.arange(4).float().unsqueeze(1) + 200
    v = torch.arange(4).float().unsqueeze(1) + 300
    fused = mapping.to_megatron("decoder.layers.0.self_attention.linear_qkv.weight", [q, k, v], padded_vocab=10)
    # 2 groups; each: 2 q heads (4 rows), 1 k head (2 rows), 1 v head (2 rows)
    expected = [100, 101, 102, 103, 200, 201, 300, 301, 104, 105, 106, 107, 202, 203, 302, 303]
    assert fused.squeeze(1).tolist() == expected
    back = dict(mapping.to_hf("decoder.layers.0.self_attention.linear_qkv.weight", fused))
    assert torch.equal(back["model.layers.0.self_attn.q_proj.weight"], q)
    assert torch.equal(back["model.layers.0.self_attn.k_proj.weight"], k)
    assert torch.equal(back["model.layers.0.self_attn.v_proj.weight"], v)


def test_qkv_bias_round_trip():
    mapping = mapping_for(_shape())
    q, k, v = torch.randn(8), torch.randn(4), torch.randn(4)
    fused = mapping.to_megatron("decoder.layers.1.self_attention.linear_qkv.bias", [q, k, v], padded_vocab=10)
    back = [t for _, t in mapping.to_hf("decoder.layers.1.self_attention.linear_qkv.bias", fused)]
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v)))


def test_fc1_tp_shards_hold_gate_and_up_halves():
    mapping = mapping_for(_shape())
    gate, up = torch.arange(6).float().unsqueeze(1), torch.arange(6).float().unsqueeze(1) + 10
    full = mapping.to_megatron("decoder.layers.0.mlp.linear_fc1.weight", [gate, up], padded_vocab=10)
    param = _tp_param((6, 1), dim=0)
    shards = [mapping.shard("decoder.layers.0.mlp.linear_fc1.weight", full, param, 2, r) for r in range(2)]
    assert shards[0].squeeze(1).tolist() == [0, 1, 2, 10, 11, 12]
    assert shards[1].squeeze(1).tolist() == [3, 4, 5, 13, 14, 15]
    assert torch.equal(mapping.unshard("decoder.layers.0.mlp.linear_fc1.weight", shards, param), full)


def test_vocab_padding_never_reaches_hf():
    mapping = mapping_for(_shape(vocab_size=9))
    emb = torch.randn(9, 8)
    padded = mapping.to_megatron("embedding.word_embeddings.weight", [emb], padded_vocab=10)
    assert padded.shape == (10, 8) and torch.all(padded[9] == 0)
    ((name, back),) = mapping.to_hf("embedding.word_embeddings.weight", padded)
    assert name == "model.embed_tokens.weight" and torch.equal(back, emb)


def test_names_per_family():
    qwen3 = mapping_for(_shape(family="qwen3", qkv_bias=False, qk_layernorm=True))
    names = qwen3.hf_param_names()
    assert "model.layers.1.self_attn.q_norm.weight" in names and "lm_head.weight" in names
    assert not any(n.endswith(".bias") for n in names)
    llama = mapping_for(_shape(family="llama", qkv_bias=False, tie_word_embeddings=True))
    assert "lm_head.weight" not in llama.hf_param_names()
    assert "model.layers.0.self_attn.q_proj.bias" in mapping_for(_shape()).hf_param_names()
    with pytest.raises(KeyError, match="no HF counterpart"):
        llama.hf_names("decoder.layers.0.self_attention.q_layernorm.weight")


def test_te_names_and_pipeline_offsets():
    assert canonical("decoder.layers.3.self_attention.linear_qkv.layer_norm_weight") == \
        "decoder.layers.3.input_layernorm.weight"
    assert canonical("decoder.layers.0.mlp.linear_fc1.layer_norm_weight") == "decoder.layers.0.pre_mlp_layernorm.weight"
    assert global_param_name("decoder.layers.1.mlp.linear_fc2.weight", 2) == "decoder.layers.3.mlp.linear_fc2.weight"
    assert global_param_name("embedding.word_embeddings.weight", 2) == "embedding.word_embeddings.weight"
