"""tools/seed_stats.py: seed-level and item-by-item comparison of a trained model with the best other row."""

import gzip
import json

import pytest

from tools.seed_stats import main


def write_seed(path, values: dict[str, float], extra: str = "qa_before"):
    path.write_text("".join(json.dumps({"_id": i, "delta": v, "qa_after": v + 0.5, extra: 0.5}) + "\n"
                            for i, v in values.items()))
    return path


def test_the_first_model_against_the_best_other_by_seed_and_by_item(tmp_path, capsys):
    items = [f"q{i}" for i in range(20)]
    # RL: one item gains 1.0 in every seed, the rest 0.01 or 0.02 by seed; SFT: -0.05 everywhere; no-op: 0.
    for seed, small in enumerate((0.01, 0.02, 0.01)):
        write_seed(tmp_path / f"rl_s{seed}.jsonl", {i: (1.0 if i == "q0" else small) for i in items})
    for seed in range(2):
        write_seed(tmp_path / f"sft_s{seed}.jsonl", {i: -0.05 for i in items})
    write_seed(tmp_path / "noop.jsonl", {i: 0.0 for i in items})
    result = main(["--key", "delta", "--model", f"RL={tmp_path}/rl_s*.jsonl",
                   "--model", f"SFT={tmp_path}/sft_s*.jsonl", "--model", f"no-op={tmp_path}/noop.jsonl"])
    rl = result["models"]["RL"]
    assert len(rl["seeds"]) == 3 and rl["low"] < rl["mean"] < rl["high"]
    assert result["models"]["no-op"]["low"] == result["models"]["no-op"]["high"] == 0.0
    assert result["against"] == "no-op"  # the best of the others: doing nothing beats SFT here
    seed_level = result["seed_level"]
    assert seed_level["difference"] == pytest.approx(rl["mean"]) and seed_level["low"] > 0
    paired = result["paired"]
    assert paired["gain"] == 20 and paired["loss"] == 0
    # The top 5% (one item of 20) carries 1.0 of the 1.0 + 19 x 0.0133 summed gain
    assert paired["top5pct_share_of_gain"] == pytest.approx(1.0 / (1.0 + 19 * 0.04 / 3))
    assert "the top 5% of items carry 80% of the gain" in capsys.readouterr().out
    # A difference of two fields, and the same answer from it
    same = main(["--key", "qa_after-qa_before", "--model", f"RL={tmp_path}/rl_s*.jsonl",
                 "--model", f"no-op={tmp_path}/noop.jsonl"])
    assert same["seed_level"]["difference"] == pytest.approx(seed_level["difference"])
    # The records keep samples gzipped: read as they are, with the same answer.
    for seed in range(3):
        plain = tmp_path / f"rl_s{seed}.jsonl"
        (tmp_path / f"rl_s{seed}.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    zipped = main(["--key", "delta", "--model", f"RL={tmp_path}/rl_s*.jsonl.gz",
                   "--model", f"no-op={tmp_path}/noop.jsonl"])
    assert zipped["seed_level"]["difference"] == pytest.approx(seed_level["difference"])


def test_a_seed_that_dropped_an_item_is_an_error_not_a_smaller_mean(tmp_path):
    write_seed(tmp_path / "rl_s0.jsonl", {"a": 1.0, "b": 0.0})
    write_seed(tmp_path / "base.jsonl", {"a": 0.0})
    with pytest.raises(ValueError, match=r"base, seed file 0: its items differ from RL's \(missing \['b'\]"):
        main(["--key", "delta", "--model", f"RL={tmp_path}/rl_s0.jsonl", "--model", f"base={tmp_path}/base.jsonl"])
    (tmp_path / "bad.jsonl").write_text('{"_id": "a", "delta": 1}\n{"_id": "b"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: no field 'delta'"):
        main(["--key", "delta", "--model", f"RL={tmp_path}/bad.jsonl"])


def test_runs_that_wrote_the_same_questions_to_folders_of_their_own_pair_up_by_file_and_line(tmp_path):
    """A sweep's variants each prepare their data in their own folder (2026-12-01: the 1.5B MemUpdate sweep), so
    the same question's id differs by folder; its prompt says whether it is the same question."""
    def write(name: str, folder: str, deltas: list[float], prompts: list[str]):
        (tmp_path / name).write_text("".join(
            json.dumps({"_id": f"/runs/{folder}/data/val.jsonl:{i + 1}#0", "prompt": p, "delta": d}) + "\n"
            for i, (d, p) in enumerate(zip(deltas, prompts))))
    write("a.jsonl", "v0", [0.1, 0.2], ["When?", "Where?"])
    write("b.jsonl", "v1", [0.0, 0.0], ["When?", "Where?"])
    result = main(["--key", "delta", "--model", f"A={tmp_path}/a.jsonl", "--model", f"B={tmp_path}/b.jsonl"])
    assert result["items"] == 2 and result["paired"]["gain"] == 2
    write("c.jsonl", "v2", [0.0, 0.0], ["When?", "Who?"])  # line 2 holds another question there
    with pytest.raises(ValueError, match=r"c.jsonl:2: item val.jsonl:2#0's prompt differs from the one at .*a.jsonl:2"):
        main(["--key", "delta", "--model", f"A={tmp_path}/a.jsonl", "--model", f"C={tmp_path}/c.jsonl"])


def test_one_seed_each_prints_no_interval_over_seeds(tmp_path, capsys):
    """A single seed has no spread: the table and the seed-level line say so instead of printing the point twice
    as an interval (the 1.5B sweep's one-seed table, 2026-12-02); the item-by-item interval stays."""
    write_seed(tmp_path / "rl_s0.jsonl", {"a": 0.2, "b": 0.0, "c": 0.1})
    write_seed(tmp_path / "sft_s0.jsonl", {"a": 0.0, "b": 0.0, "c": 0.0})
    result = main(["--key", "delta", "--model", f"RL={tmp_path}/rl_s0.jsonl",
                   "--model", f"SFT={tmp_path}/sft_s0.jsonl"])
    out = capsys.readouterr().out
    assert "| RL | 1 | 0.1000 | - (one seed) |" in out and "| SFT | 1 | 0.0000 | - (one seed) |" in out
    assert "- seeds: +0.1000 (one seed each: no seed-level interval)" in out
    paired = result["paired"]
    assert paired["low"] < paired["difference"] < paired["high"] and f"(95% {paired['low']:+.4f}" in out
