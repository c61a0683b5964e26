"""tools/make_random_hf.py writes a checkpoint that transformers loads, with Qwen's tokenizer beside it."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tools.bench_train import hf_config
from tools.make_random_hf import write_hf_dir


def test_a_small_qwen3_checkpoint_loads(tmp_path):
    config = {**hf_config("qwen3-0.6b"), "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96}
    folder = write_hf_dir(config, tmp_path / "model", seed=1)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.architectures == ["Qwen3ForCausalLM"] and model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 151936
    assert tokenizer.convert_ids_to_tokens(model.config.eos_token_id) == "<|im_end|>"
    weight = model.model.layers[0].mlp.down_proj.weight.float()
    assert 0.01 < weight.std().item() < 0.03  # the model's own initialisation (initializer_range 0.02)
    again = AutoModelForCausalLM.from_pretrained(write_hf_dir(config, tmp_path / "again", seed=1))
    assert torch.equal(again.model.layers[0].mlp.down_proj.weight.float(), weight)  # the seed fixes the draw
