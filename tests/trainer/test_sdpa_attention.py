"""SDPAAttention computes what megatron-core's DotProductAttention computes (grouped-query attention, causal and
explicit masks), on the CPU; packed (THD) sequences get what each gets alone in a padded batch."""

from tests import dist_workers
from tests.conftest import run_workers
from vime_ext.models.model_config import ParallelConfig


def test_sdpa_matches_megatron_attention(tmp_path):
    result = run_workers(dist_workers.attention_kernels_agree, ParallelConfig(), tmp_path, "attention.json")
    for case in ("causal", "padding_mask"):
        assert result[case]["shape"] == [9, 2, 64]
        assert result[case]["max_abs_diff"] < 1e-5, result
    assert result["packed"]["shape"] == [15, 64]
    assert result["packed"]["max_abs_diff"] < 1e-5, result
