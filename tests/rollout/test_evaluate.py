"""vime_ext.evaluate: an HF checkpoint scored through a fresh engine with the same plug-ins as training."""

from vime_ext.data.synthetic import write_jsonl


def test_evaluate_scores_a_checkpoint_through_an_engine(tiny_hf_dirs, tmp_path):
    from vime_ext.evaluate import main

    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 3)
    metrics = main(["--hf-checkpoint", str(tiny_hf_dirs["llama"]), "--prompt-data", str(data), "--engine-backend",
                    "hf", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4",
                    "--custom-rm-path", "tests.train.toy_rewards.even_token_share"])
    assert metrics["eval/samples"] == 6.0 and metrics["eval/failed"] == 0.0
    assert 0.0 <= metrics["eval/reward_mean"] <= 1.0 and 0 < metrics["eval/response_length"] <= 4.0
