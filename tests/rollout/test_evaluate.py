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


def test_a_stopped_evaluation_goes_on_from_its_results(tiny_hf_dirs, tmp_path):
    """With --results, each rewarded sample is a line as soon as it is done; a run stopped part-way (two whole
    lines and a torn third) is taken up by the next run, which keeps those two and does the rest once."""
    import json

    from vime_ext.evaluate import main

    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 3)
    results = tmp_path / "samples.jsonl"
    argv = ["--hf-checkpoint", str(tiny_hf_dirs["llama"]), "--prompt-data", str(data), "--engine-backend", "hf",
            "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4",
            "--custom-rm-path", "tests.train.toy_rewards.even_token_share", "--results", str(results)]
    first = main(argv)
    lines = results.read_text().splitlines()
    ids = sorted(json.loads(line)["_id"] for line in lines)
    assert first["eval/samples"] == 6.0 and len(ids) == 6 == len(set(ids))
    assert all(json.loads(line)["reward"] is not None for line in lines)
    results.write_text("\n".join(lines[:2]) + "\n" + lines[2][:30])
    again = main(argv)
    kept = results.read_text().splitlines()
    assert kept[:2] == lines[:2] and len(kept) == 6 and again["eval/samples"] == 6.0
    assert sorted(json.loads(line)["_id"] for line in kept) == ids
