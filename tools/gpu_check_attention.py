"""bf16 logits of both CUDA layer specs without TE (megatron-core's local attention and SDPA) against fp32
transformers, for tiny random Qwen3 and Qwen2 models with their real tokenizer (no SmolLM2 needed).

    python3 tools/gpu_check_attention.py
"""

import json
import tempfile
from pathlib import Path

import torch


def main() -> None:
    from tests import dist_workers
    from tests.conftest import make_tiny_hf_dir, run_workers
    from vime_ext.models.model_config import ParallelConfig

    root = Path(tempfile.mkdtemp())
    dirs = {f: make_tiny_hf_dir(f, root / f, seed=i, cache_dir=root) for i, f in enumerate(("qwen3", "qwen2"))}
    report = {}
    for attention in ("local", "sdpa"):
        out = root / attention
        out.mkdir()
        report[attention] = run_workers(dist_workers.logit_parity, ParallelConfig(), out, "parity.json", dirs,
                                        ParallelConfig(), None, torch.bfloat16, attention)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
