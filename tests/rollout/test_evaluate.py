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
    metadata["resume"] when an earlier run stopped in the item (here: its step 3 failed the first time, in a run
    of one attempt an item); a finished item's state is dropped, and the progress file is gone once every item
    has its row."""
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

    def run(attempts: int):
        items = [(name, Sample(prompt=name, index=i)) for i, name in enumerate(("short", "long"))]
        return asyncio.run(evaluate_items(plugin_args([], {}), "http://127.0.0.1:9", items, generate, row,
                                          SamplingParams(), tmp_path / "rows.jsonl", attempts=attempts))

    first = run(attempts=1)
    progress = tmp_path / "rows.progress.jsonl"
    assert list(first.rows) == ["short"] and started == {"short": 0, "long": 0, "failed once": 1}
    assert [json.loads(line) for line in progress.read_text().splitlines()] == [{"_id": "long", "state": {"step": 2}}]
    second = run(attempts=1)
    assert started["long"] == 2 and second.rows["long"]["response"] == "steps to 3"
    assert not progress.exists()


def test_a_failed_item_is_tried_again_in_the_same_run_and_one_that_always_fails_is_named(tmp_path, caplog):
    """Within one run (two attempts by default): an item that failed once is run again from a fresh copy of
    its sample, handed the state its failed attempt saved, and scored; an item that fails every attempt is
    listed in .failed.jsonl with its error and named in one warning, and the items scored stay scored."""
    import asyncio
    import json
    import logging

    from vime_ext.agent.sample import Sample, Status
    from vime_ext.engines.protocol import SamplingParams
    from vime_ext.evaluate import evaluate_items
    from vime_ext.rollout.plugins import plugin_args

    calls: list[tuple[str, object, str]] = []

    async def generate(args, sample, params, evaluation=False):
        resume = sample.metadata.get("resume")
        calls.append((sample.prompt, resume, sample.response))
        sample.response += "written"  # a retry that reused this sample would see it
        if sample.prompt == "flaky":
            args.save_progress(sample, {"step": 1})
            if resume is None:
                raise RuntimeError("the engine dropped the connection")
        if sample.prompt == "broken":
            raise RuntimeError("no attention kernel for this head size")
        sample.status = Status.COMPLETED
        return sample

    async def row(item_id, sample):
        return {"response": sample.response}

    items = [(name, Sample(prompt=name, index=i)) for i, name in enumerate(("fine", "flaky", "broken"))]
    with caplog.at_level(logging.WARNING, logger="vime_ext.evaluate"):
        done = asyncio.run(evaluate_items(plugin_args([], {}), "http://127.0.0.1:9", items, generate, row,
                                          SamplingParams(), tmp_path / "rows.jsonl"))
    assert sorted(done.rows) == ["fine", "flaky"] and done.rows["flaky"]["response"] == "written"
    assert sorted(calls, key=repr) == sorted([("broken", None, ""), ("broken", None, ""), ("fine", None, ""),
                                              ("flaky", None, ""), ("flaky", {"step": 1}, "")], key=repr)
    [failed] = [json.loads(line) for line in (tmp_path / "rows.failed.jsonl").read_text().splitlines()]
    assert failed["_id"] == "broken" and "no attention kernel" in failed["error"]
    assert [s.prompt for s in done.failed] == ["broken"]
    [warning] = [r.getMessage() for r in caplog.records if "not scored" in r.getMessage()]
    assert "1 of 3 items failed 2 time(s)" in warning and "broken: RuntimeError: no attention kernel" in warning


def test_an_evaluation_that_leaves_items_unscored_exits_3_after_its_figures(tiny_hf_dirs, tmp_path, capsys):
    """python -m vime_ext.evaluate: the items that failed twice (here the reward refuses the second prompt's
    samples) are listed, the others scored and kept, the figures printed, and the exit status is 3, so that a
    script under set -e stops instead of taking the figures for a whole evaluation."""
    import json

    import pytest

    from vime_ext.evaluate import UNSCORED_EXIT, main

    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 3)
    results = tmp_path / "samples.jsonl"
    with pytest.raises(SystemExit) as stop:
        main(["--hf-checkpoint", str(tiny_hf_dirs["llama"]), "--prompt-data", str(data), "--engine-backend", "hf",
              "--n-samples-per-prompt", "2", "--rollout-max-response-len", "4", "--results", str(results),
              "--custom-rm-path", "tests.train.toy_rewards.even_token_share_refusing_the_second_prompt"])
    assert stop.value.code == UNSCORED_EXIT == 3
    out, err = capsys.readouterr()
    assert json.loads(out)["eval/unscored"] == 2.0
    assert "vime_ext.evaluate: 2 item(s) not scored after 2 attempts each" in err
    assert len(results.read_text().splitlines()) == 4
    failed = [json.loads(line) for line in (tmp_path / "samples.failed.jsonl").read_text().splitlines()]
    assert len(failed) == 2 and all("refuses the second prompt" in f["error"] for f in failed)


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
