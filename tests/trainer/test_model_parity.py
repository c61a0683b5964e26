"""Megatron GPTModel logits equal transformers' logits for each family, at TP=1, TP=2 and PP=2 (gloo, CPU)."""

import json
import math

import pytest
import torch

from tests import dist_workers
from tests.conftest import run_workers
from vime_ext.models.model_config import ParallelConfig

LAYOUTS = {"tp1": ParallelConfig(), "tp2": ParallelConfig(tensor_model_parallel_size=2),
           "pp2": ParallelConfig(pipeline_model_parallel_size=2)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_logits_match_transformers(layout, tiny_hf_dirs, tmp_path):
    parallel = LAYOUTS[layout]
    results = run_workers(dist_workers.logit_parity, parallel, tmp_path, "parity.json", tiny_hf_dirs, parallel)
    assert set(results) == set(tiny_hf_dirs)
    for family, result in results.items():
        assert result["shape_equal"], family
        assert result["max_abs_diff"] <= 1e-4, (family, result)


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_sdpa_attention_logits_match_transformers(layout, tiny_hf_dirs, tmp_path):
    """The CUDA layer spec without TE (SDPA core attention) computes the same logits; run on the CPU here."""
    parallel = LAYOUTS[layout]
    results = run_workers(dist_workers.logit_parity, parallel, tmp_path, "parity.json", tiny_hf_dirs, parallel,
                          None, torch.float32, "sdpa")
    for family, result in results.items():
        assert result["max_abs_diff"] <= 1e-4, (family, result)


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_one_optimizer_step_reduces_loss(layout, tiny_hf_dirs, tmp_path):
    parallel = LAYOUTS[layout]
    losses = run_workers(dist_workers.train_step, parallel, tmp_path, "train.json", str(tiny_hf_dirs["qwen3"]),
                         parallel)["losses"]
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[1] < losses[0] - 1e-3 and losses[2] < losses[1], losses


GPU_LAYOUTS = [name for name, p in LAYOUTS.items() if p.model_parallel_size <= torch.cuda.device_count()]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention", ["local", "sdpa"])
@pytest.mark.parametrize("layout", GPU_LAYOUTS)
def test_bf16_logits_on_gpu(layout, attention, tiny_hf_dirs, tmp_path):
    """In bf16 Megatron's error against fp32 HF logits stays within twice HF's own bf16 error, with either
    layer spec that runs without Transformer Engine."""
    parallel = LAYOUTS[layout]
    results = run_workers(dist_workers.logit_parity, parallel, tmp_path, "parity.json", tiny_hf_dirs, parallel,
                          None, torch.bfloat16, attention)
    print(json.dumps(results, indent=1))
    assert set(results) == set(tiny_hf_dirs)
    for family, r in results.items():
        assert r["max_abs_err"] <= 2 * r["hf_max_abs_err"] + 1e-3, (family, r)


@pytest.mark.parametrize("layout", ["tp1", "tp2"])
def test_vocab_parallel_log_probs_match_full_softmax(layout, tiny_hf_dirs, tmp_path):
    parallel = LAYOUTS[layout]
    result = run_workers(dist_workers.log_prob_paths_agree, parallel, tmp_path, "log_probs.json",
                         str(tiny_hf_dirs["qwen3"]), parallel)
    assert result["shape"] == [2, 19] and result["max_abs_diff"] < 1e-5, result
    assert result["padded_vocab_diff"] < 1e-5, result  # padding columns carry no probability
