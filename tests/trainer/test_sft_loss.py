"""SFT's loss is transformers' cross-entropy on the same masked tokens: the Megatron model's mean negative
log-likelihood over the assistant tokens of real chats (a tiny random Qwen3 with Qwen's tokenizer and chat
template), fp32, at TP=1 and TP=2 with packed sequences, equals ``torch.nn.functional.cross_entropy`` of the HF
model over exactly the tokens the mask trains; PP=2, DP=2 and bf16 too, by hand."""

import json
import os

import pytest
import torch
import torch.nn.functional as F

from tests import dist_workers
from tests.conftest import require_ranks
from vime_ext.trainer.launch import run_on_ranks

LAYOUTS = {"tp1": [], "tp2": ["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2"]}
# Left out of the suite for its time (the loss is the RL loss's per-micro-batch code, whose layouts
# test_actor_layouts.py covers); VIME_EXT_ALL_LAYOUTS=1 runs them (all passed on 2026-11-25).
MORE_LAYOUTS = {"pp2": ["--actor-num-gpus-per-node", "2", "--pipeline-model-parallel-size", "2"],
                "dp2_dynamic": ["--actor-num-gpus-per-node", "2", "--use-dynamic-batch-size",
                                "--max-tokens-per-gpu", "80"],
                "bf16": ["--bf16"]}  # against fp32 transformers: to bf16's rounding
ALL_LAYOUTS = {**LAYOUTS, **MORE_LAYOUTS}
BY_HAND = pytest.mark.skipif(os.environ.get("VIME_EXT_ALL_LAYOUTS") != "1",
                             reason="run by hand: VIME_EXT_ALL_LAYOUTS=1")


def hf_cross_entropy(hf_dir, sequences) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for tokens, mask in sequences:
            ids = torch.tensor([tokens])
            logits = model(ids).logits[0, :-1].float()
            targets = ids[0, 1:].masked_fill(torch.tensor(mask) == 0, -100)  # -100: ignored by cross_entropy
            total += F.cross_entropy(logits, targets, ignore_index=-100, reduction="sum").item()
            count += sum(mask)
    return total / count


@pytest.mark.parametrize("layout", [*LAYOUTS, *(pytest.param(k, marks=BY_HAND) for k in MORE_LAYOUTS)])
def test_sft_loss_equals_transformers_cross_entropy(layout, tiny_hf_dirs, tmp_path):
    world = 2 if "--actor-num-gpus-per-node" in ALL_LAYOUTS[layout] else 1
    require_ranks(world)
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": dist_workers.SFT_CHATS[2]}) + "\n")
    hf_dir = tiny_hf_dirs["qwen3"]
    flags = ["--hf-checkpoint", str(hf_dir), "--prompt-data", str(data), "--input-key", "messages",
             "--loss-type", "sft_loss", "--rollout-function-path", "vime_ext.rollout.sft_rollout.generate_rollout",
             "--n-samples-per-prompt", "1", "--rollout-batch-size", str(len(dist_workers.SFT_CHATS)),
             "--micro-batch-size", "2", "--lr", "1e-3", *ALL_LAYOUTS[layout]]
    run_on_ranks(dist_workers.sft_loss_step, world, str(tmp_path), flags, isolate=True)
    shares = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("sft_dp*.json"))]
    assert len(shares) == (2 if layout.startswith("dp2") else 1)
    sequences = shares[0]["sequences"]
    assert all(0 < sum(mask) < len(mask) for _, mask in sequences)  # prompt tokens masked, assistant ones not
    expected = hf_cross_entropy(hf_dir, sequences)
    assert sum(s["loss"] for s in shares) == pytest.approx(expected, rel=1e-2 if layout == "bf16" else 1e-5)
