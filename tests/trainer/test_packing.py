"""A packed micro-batch (THD) gives each sequence the log-probs and gradients it gets in a right-padded batch:
fp32 on the CPU (one SDPA call per sequence), and bf16 on CUDA through torch's varlen flash attention with the
fused THD RoPE, held to the size of the padded bf16 model's own error against fp32."""

import pytest
import torch

from tests import dist_workers
from tests.conftest import run_workers
from vime_ext.trainer.model_config import ParallelConfig


def test_packed_matches_padded(tiny_hf_dirs, tmp_path):
    result = run_workers(dist_workers.packed_matches_padded, ParallelConfig(), tmp_path, "packed.json",
                         str(tiny_hf_dirs["qwen3"]), "float32")
    assert result["tokens"] == 36 + 4 + 63 + 19
    assert result["packed_vs_padded"]["log_prob"] < 1e-4, result
    assert result["packed_vs_padded"]["grad_rel"] < 1e-4, result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_matches_padded_in_bf16_on_cuda(tiny_hf_dirs, tmp_path):
    result = run_workers(dist_workers.packed_matches_padded, ParallelConfig(), tmp_path, "packed.json",
                         str(tiny_hf_dirs["qwen3"]), "bfloat16")
    assert result["varlen"], "this torch has no torch.nn.attention.varlen; the per-sequence path ran"
    for key in ("log_prob", "grad_rel"):
        assert result["packed_vs_fp32"][key] <= 2 * result["padded_vs_fp32"][key] + 1e-3, (key, result)
