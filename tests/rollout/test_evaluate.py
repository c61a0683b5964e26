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


def test_an_item_over_the_time_limit_fails_alone_and_is_listed(tmp_path):
    """evaluate_items holds each item's generate and row to timeout_s: the slow item is listed as failed with
    the limit named, the quick one is scored; neither waits for the other."""
    import asyncio
    import json

    from vime_ext.agent.sample import Sample, Status
    from vime_ext.engines.protocol import SamplingParams
    from vime_ext.evaluate import evaluate_items
    from vime_ext.rollout.plugins import plugin_args

    async def generate(args, sample, params, evaluation=False):
        if sample.prompt == "slow":
            await asyncio.sleep(30)
        sample.response, sample.status = "done", Status.COMPLETED
        return sample

    async def row(item_id, sample):
        return {"response": sample.response}

    items = [(name, Sample(prompt=name, index=i)) for i, name in enumerate(("quick", "slow"))]
    out = tmp_path / "rows.jsonl"
    done = asyncio.run(evaluate_items(plugin_args([], {}), "http://127.0.0.1:9", items, generate, row,
                                      SamplingParams(), out, timeout_s=0.5))
    assert list(done.rows) == ["quick"] and done.rows["quick"]["response"] == "done"
    assert 0 <= done.rows["quick"]["seconds"] < 0.5  # its own time, under the limit
    [failed] = [json.loads(line) for line in (tmp_path / "rows.failed.jsonl").read_text().splitlines()]
    assert failed["_id"] == "slow" and failed["status"] == "failed" and "timed out after 0.5 s" in failed["error"]


def test_an_item_stopped_part_way_is_handed_its_saved_state_by_the_next_run(tmp_path):
    """A plug-in that saves its state as it goes (args.save_progress) gets the last state back in
    metadata["resume"] when an earlier run stopped in the item (here: its step 2 failed the first time); a
    finished item's state is dropped, and the progress file is gone once every item has its row."""
    import asyncio
    import json

    from vime_ext.agent.sample import Sample, Status
    from vime_ext.engines.protocol import SamplingParams
    from vime_ext.evaluate import evaluate_items
    from vime_ext.rollout.plugins import plugin_args

    started: dict[str, int] = {}

    async def generate(args, sample, params, evaluation=False):
        step = (sample.metadata.get("resume") or {"step": 0})["step"]
        started[sample.prompt] = step
        for step in range(step + 1, 4):
            if sample.prompt == "long" and step == 3 and "failed once" not in started:
                started["failed once"] = 1
                raise RuntimeError("stopped in step 3")
            args.save_progress(sample, {"step": step})
        sample.response, sample.status = f"steps to {step}", Status.COMPLETED
        return sample

    async def row(item_id, sample):
        return {"response": sample.response}

    def run():
        items = [(name, Sample(prompt=name, index=i)) for i, name in enumerate(("short", "long"))]
        return asyncio.run(evaluate_items(plugin_args([], {}), "http://127.0.0.1:9", items, generate, row,
                                          SamplingParams(), tmp_path / "rows.jsonl"))

    first = run()
    progress = tmp_path / "rows.progress.jsonl"
    assert list(first.rows) == ["short"] and started == {"short": 0, "long": 0, "failed once": 1}
    assert [json.loads(line) for line in progress.read_text().splitlines()] == [{"_id": "long", "state": {"step": 2}}]
    second = run()
    assert started["long"] == 2 and second.rows["long"]["response"] == "steps to 3"
    assert not progress.exists()


def test_the_progress_file_stays_small_and_survives_a_torn_line(tmp_path):
    from vime_ext.item_progress import COMPACT_FACTOR, ItemProgress

    path = tmp_path / "p.jsonl"
    saved = ItemProgress(path, finished=set())
    for step in range(50):
        for item in ("a", "b"):
            saved.save(item, {"step": step})
        assert len(path.read_text().splitlines()) <= COMPACT_FACTOR * 2 + 1
    saved.finish("a")
    saved.compact()
    path.write_text(path.read_text() + '{"_id": "b", "sta')  # a kill in the middle of a save
    again = ItemProgress(path, finished={"c"})
    assert again.state("b") == {"step": 49} and again.state("a") is None
    assert path.read_text() == '{"_id": "b", "state": {"step": 49}}\n'
