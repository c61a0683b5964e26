"""The optimizer's state survives a checkpoint exactly: a trainer that loads a save takes the same next step as
the one that never stopped, and a step with non-finite gradients is skipped. On the CPU that is vime_ext's
AdamW, and the resumed weights are bit-identical. On CUDA it is megatron-core's distributed optimizer with both
overlaps (on two GPUs with its state sharded over two data-parallel ranks) and with its CPU offload. CUDA's
embedding and attention backward passes add in no fixed order, so there the weights after the step agree only
within the bound below. Adam's eps is small, so the step depends on the restored moments, not only on the
gradient."""

import json
import math
from pathlib import Path

import pytest
import torch

from tests import dist_workers
from tests.conftest import require_ranks
from vime_ext.trainer.launch import run_on_ranks

DISTRIBUTED = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
OFFLOAD = ["--use-distributed-optimizer", "--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d"]
# The CPU drops the CUDA flags and runs vime_ext's AdamW: an offload case would repeat the distributed one there.
OFFLOAD_NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                                        reason="--optimizer-cpu-offload is megatron-core's, which needs CUDA")


def trainer_flags(tiny_hf_dirs, tmp_path, ranks: int, cuda_flags: list[str]) -> list[str]:
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "x", "label": "y"}) + "\n")
    return ["--hf-checkpoint", str(tiny_hf_dirs["qwen3"]), "--prompt-data", str(data), "--bf16",
            "--rollout-batch-size", "8", "--n-samples-per-prompt", "1", "--global-batch-size", "8",
            "--micro-batch-size", "2", "--lr", "1e-3", "--clip-grad", "0.5", "--num-rollout", "2",
            "--actor-num-gpus-per-node", str(ranks), *(cuda_flags if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("ranks,cuda_flags", [pytest.param(1, DISTRIBUTED, id="1rank"),
                                              pytest.param(2, DISTRIBUTED, id="2ranks"),
                                              pytest.param(1, OFFLOAD, id="offload", marks=OFFLOAD_NEEDS_CUDA)])
def test_resumed_step_equals_the_uninterrupted_one(ranks, cuda_flags, tiny_hf_dirs, tmp_path):
    require_ranks(ranks)
    flags = trainer_flags(tiny_hf_dirs, tmp_path, ranks, cuda_flags)
    for resume in (False, True):
        run_on_ranks(dist_workers.resume_step, ranks, str(tmp_path), flags, resume, isolate=True)
    whole = torch.load(tmp_path / "whole_weights_pp0.pt")
    resumed = torch.load(tmp_path / "resumed_weights_pp0.pt")
    for dp in range(ranks):
        expected, got = (json.loads(Path(tmp_path, f"{tag}_steps_dp{dp}.json").read_text())[0]
                         for tag in ("whole", "resumed"))
        assert expected["grad_norm"] > 0 and got == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert sorted(whole) == sorted(resumed)
    # CUDA: one bf16 step plus half the learning rate. Adam divides each gradient by its own running size, so
    # where a gradient is tiny, CUDA's run-to-run noise in it moves the update by up to lr (measured on an H200:
    # 4.4e-4 beyond one bf16 step at lr 1e-3); the statistics above, computed from the restored weights, agree.
    ulps, slack = (1, 0.5e-3) if torch.cuda.is_available() else (0, 0.0)
    assert max(((whole[k] - resumed[k]).abs() - ulps * whole[k].abs() * 2**-7).max().item() for k in whole) <= slack


@pytest.mark.parametrize("cuda_flags", [pytest.param(DISTRIBUTED, id="distributed"),
                                        pytest.param(OFFLOAD, id="offload", marks=OFFLOAD_NEEDS_CUDA)])
def test_a_non_finite_gradient_skips_the_step(cuda_flags, tiny_hf_dirs, tmp_path):
    """A NaN advantage makes every gradient NaN: the step is skipped and says so, the weights stay as they
    were, and the next (finite) step trains."""
    flags = trainer_flags(tiny_hf_dirs, tmp_path, 1, cuda_flags)
    run_on_ranks(dist_workers.non_finite_step, 1, str(tmp_path), flags, isolate=True)
    result = json.loads((tmp_path / "non_finite.json").read_text())
    poisoned, clean = result["steps"]
    assert poisoned["skipped"] == 1.0 and not math.isfinite(poisoned["grad_norm"])
    assert clean["skipped"] == 0.0 and math.isfinite(clean["grad_norm"]) and clean["grad_norm"] > 0
    assert result["changed_by_poisoned"] == 0 and result["changed_by_clean"] > 0


def test_a_save_without_optimizer_state_resumes_from_its_weights(tiny_hf_dirs, tmp_path):
    """``--no-save-optim``: the checkpoint holds the weights but no optimizer tensors, and a run that loads it
    takes its next step from those weights (same loss and gradient norm as the uninterrupted run) with a fresh
    optimizer (so different weights after the step: Adam's moments start again)."""
    flags = trainer_flags(tiny_hf_dirs, tmp_path, 1, DISTRIBUTED) + ["--save", str(tmp_path / "unused"),
                                                                      "--no-save-optim"]
    for resume in (False, True):
        run_on_ranks(dist_workers.resume_step, 1, str(tmp_path), flags, resume, isolate=True)
    from megatron.core import dist_checkpointing

    saved = dist_checkpointing.load_tensors_metadata(str(tmp_path / "checkpoint" / "iter_0000001"))
    assert saved and not any(key.startswith("optimizer") for key in saved)
    expected, got = (json.loads(Path(tmp_path, f"{tag}_steps_dp0.json").read_text())[0]
                     for tag in ("whole", "resumed"))
    assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5, abs=1e-7)
    whole, resumed = (torch.load(tmp_path / f"{tag}_weights_pp0.pt") for tag in ("whole", "resumed"))
    assert max((whole[k] - resumed[k]).abs().max().item() for k in whole) > 0
