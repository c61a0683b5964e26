"""ModelShape from HF configs, and the clear refusals for what the model provider cannot build."""

import json

import pytest
import torch

from tests.conftest import FAMILIES, tiny_config
from vime_ext.models.model_config import ModelShape, ParallelConfig, parse_dtype, transformer_config
from vime_ext.trainer.model_provider import build_gpt_model


@pytest.mark.parametrize("family", FAMILIES)
def test_shape_from_transformers_config(family):
    config = tiny_config(family)
    shape = ModelShape.from_hf_config(config.to_dict())
    assert shape.family == family
    assert (shape.num_layers, shape.hidden_size, shape.num_query_groups) == (4, 64, 2)
    assert shape.head_dim == (24 if family == "qwen3" else 16)
    assert shape.qk_layernorm == (family == "qwen3") and shape.qkv_bias == (family == "qwen2")
    assert shape.tie_word_embeddings == (family == "llama")
    assert shape.rope_theta == {"qwen3": 1e6, "qwen2": 1e4, "llama": 1e5}[family]


def test_bad_configs_name_file_and_field(tmp_path):
    base = tiny_config("llama").to_dict()
    cases = {
        "mistral": ({**base, "model_type": "mistral"}, "model_type='mistral' is not supported"),
        "no_layers": ({k: v for k, v in base.items() if k != "num_hidden_layers"},
                      "required field 'num_hidden_layers' is missing"),
        "yarn": ({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling"),
        "gelu": ({**base, "hidden_act": "gelu"}, "hidden_act='gelu'"),
    }
    for name, (config, message) in cases.items():
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=message) as err:
            ModelShape.from_hf_dir(path)
        assert str(path / "config.json") in str(err.value)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        ModelShape.from_hf_dir(tmp_path / "nowhere")


def test_dtype_auto_reads_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "bfloat16"}))
    assert parse_dtype("auto", tmp_path) == torch.bfloat16
    assert parse_dtype("float32") == torch.float32
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        parse_dtype("int8")


def test_parallel_layouts_that_cannot_split_are_refused():
    shape = ModelShape.from_hf_config(tiny_config("qwen3").to_dict())
    with pytest.raises(ValueError, match="num_layers=4 is not divisible by pipeline_model_parallel_size=3"):
        transformer_config(shape, ParallelConfig(pipeline_model_parallel_size=3))
    with pytest.raises(ValueError, match="num_query_groups=2 is not divisible by tensor_model_parallel_size=4"):
        transformer_config(shape, ParallelConfig(tensor_model_parallel_size=4))
    with pytest.raises(ValueError, match="sequence_parallel needs tensor_model_parallel_size > 1"):
        transformer_config(shape, ParallelConfig(sequence_parallel=True))
    with pytest.raises(ValueError, match="sequence_parallel needs Transformer Engine"):
        build_gpt_model(shape, ParallelConfig(2, 1, True), attention="local")


def test_norms_take_the_model_dtype_and_nothing_else_changes():
    from vime_ext.trainer.model_provider import norms_in_model_dtype

    model = torch.nn.Sequential(torch.nn.Linear(4, 4, dtype=torch.bfloat16), torch.nn.RMSNorm(4),
                                torch.nn.LayerNorm(4))
    model.register_buffer("angles", torch.ones(3))  # e.g. RoPE tables: stay fp32
    norms_in_model_dtype(model, torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.angles.dtype == torch.float32
    # bf16 input and bf16 weight: torch's fused RMSNorm (no dtype-mismatch fallback), bf16 out
    assert model[1](torch.randn(2, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16
