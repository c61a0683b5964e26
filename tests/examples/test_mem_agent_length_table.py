"""examples/mem_agent/length_table.py on summaries written as run-eval.sh writes them: the paper's layout, seeds
averaged with their spread, the goals checked, the cost per item, the JSON and the plot."""

import json

import pytest

from examples.mem_agent.eval_ruler_hqa import summarize
from examples.mem_agent.length_table import main


def write(save_dir, save_file, num_docs, sub_em, doc_tokens, seconds):
    rows = [{"judge_f1": sub_em / 100, "judge_em": sub_em / 100, "judge_sub_em": sub_em / 100,
             "doc_tokens": doc_tokens, "chunks": -(-doc_tokens // 2048), "seconds": seconds}]
    summary = summarize(rows, 0, 0, num_docs, save_file, n_proc=32)
    folder = save_dir / f"ruler_hqa_{num_docs}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{save_file}.summary.json").write_text(json.dumps(summary))


def test_the_table_averages_seeds_checks_the_goals_and_tables_the_cost(tmp_path):
    scores = {"base": (5, 0), "sft_s0": (40, 30), "sft_s1": (44, 34), "rl_s0": (60, 55), "rl_s1": (70, 61)}
    for save_file, (short, long) in scores.items():
        write(tmp_path, save_file, 170, short, 8192, 2.0)
        write(tmp_path, save_file, 21760, long, 1_048_576, 250.0)
    out = tmp_path / "table/smollm2"
    result = main(["--save-dir", str(tmp_path), "--model", "base=base", "--model", "SFT=sft_s*",
                   "--model", "SFT + RL=rl_s*", "--train-length", "170", "--cost-of", "rl_s0", "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    assert "| model | seeds | 8K | 1.00M |" in text and "| (documents) | | 170 | 21760 |" in text
    assert "| base | 1 | 5.0 | 0.0 |" in text
    assert "| SFT | 2 | 42.0 (40.0-44.0) | 32.0 (30.0-34.0) |" in text
    assert "| SFT + RL | 2 | 65.0 (60.0-70.0) | 58.0 (55.0-61.0) |" in text
    assert "over SFT at the training length: +23.0 points (goal: +10 or more): met." in text
    assert "from 8K to 1.00M: -7.0 points (goal: a loss of 10 or less): met." in text
    # Seconds per 1K document tokens: 2 s / 8192 and 250 s / 1M tokens.
    assert "| 170 | 8192 | 4.0 | 32 | 2.0 | 4096 | 0.244 |" in text
    assert "| 21760 | 1048576 | 512.0 | 32 | 250.0 | 4194 | 0.238 |" in text
    assert result["SFT + RL"]["170"]["sub_em_mean"] == 65.0 and result["SFT"]["21760"]["sub_em_min"] == 30.0
    saved = json.loads(out.with_suffix(".json").read_text())
    assert sorted(saved["SFT"]["170"]["seeds"]) == ["sft_s0", "sft_s1"]
    assert saved["base"]["170"]["em_mean"] == 5.0 and saved["base"]["170"]["f1_mean"] == 5.0
    assert out.with_suffix(".png").stat().st_size > 1000


def test_a_model_pattern_that_matches_nothing_is_named(tmp_path):
    write(tmp_path, "base", 170, 5, 8192, 2.0)
    with pytest.raises(ValueError, match=r"--model SFT=sft_s\*: no result matches; found \['base'\]"):
        main(["--save-dir", str(tmp_path), "--model", "SFT=sft_s*", "--out", str(tmp_path / "t")])


def test_each_ceiling_is_a_row_of_its_own(tmp_path):
    """A ceiling file without "keep" (written before it existed) is the recent reader's."""
    for save_file in ("sft_s0", "rl_s0"):
        write(tmp_path, save_file, 170, 30, 8192, 2.0)
    recent, relevant = tmp_path / "ceiling_recent.json", tmp_path / "ceiling_relevant.json"
    recent.write_text(json.dumps({"chunk_tokens": 2048, "memory_tokens": 248,
                                  "sub_em_by_num_docs": {"170": 71.88, "340": 62.5}}))
    relevant.write_text(json.dumps({"chunk_tokens": 2048, "memory_tokens": 248, "keep": "relevant",
                                    "sub_em_by_num_docs": {"170": 68.75, "340": 40.62}}))
    out = tmp_path / "table"
    result = main(["--save-dir", str(tmp_path), "--model", "SFT=sft_s*", "--model", "SFT + RL=rl_s*",
                   "--ceiling", str(recent), "--ceiling", str(relevant), "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    assert "| ceiling: a reader of what it has read | 1 | 71.9 | 62.5 |" in text and "| SFT | 1 | 30.0 | - |" in text
    assert "| ceiling: a reader that keeps only the novel's facts | 1 | 68.8 | 40.6 |" in text
    assert result["ceiling: a reader of what it has read"]["340"]["sub_em_mean"] == 62.5


def test_a_flat_line_at_zero_does_not_meet_the_length_goal(tmp_path):
    for save_file in ("sft_s0", "rl_s0"):
        write(tmp_path, save_file, 170, 0, 8192, 2.0)
        write(tmp_path, save_file, 340, 0, 16384, 4.0)
    out = tmp_path / "table"
    main(["--save-dir", str(tmp_path), "--model", "SFT=sft_s*", "--model", "SFT + RL=rl_s*", "--train-length", "170",
          "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    assert "+0.0 points (goal: +10 or more): missed." in text
    assert "(goal: a loss of 10 or less): not met: nothing to keep (0 at the shortest length)." in text


def test_a_length_cut_before_its_end_is_tabled_from_its_rows_and_starred(tmp_path):
    """The lease ended while the RL model read the longest length: rows saved (one torn by the kill), no summary.
    The cell is the mean over the rows there are, starred with their count, and the file is left as it was."""
    write(tmp_path, "sft_s0", 170, 40, 8192, 2.0)
    write(tmp_path, "rl_s0", 170, 60, 8192, 2.0)
    write(tmp_path, "sft_s0", 21760, 30, 1_048_576, 250.0)
    rows = [{"_id": str(i), "judge_f1": 1.0, "judge_em": float(i == 0), "judge_sub_em": float(i < 2),
             "doc_tokens": 1_048_576, "chunks": 512, "seconds": 250.0} for i in range(4)]
    cut = tmp_path / "ruler_hqa_21760" / "rl_s0.jsonl"
    text = "".join(json.dumps(row) + "\n" for row in rows) + '{"_id": "4", "judge_'
    cut.write_text(text)
    (tmp_path / "ruler_hqa_21760" / "rl_s0.failed.jsonl").write_text(json.dumps({"_id": "9"}) + "\n")
    out = tmp_path / "table"
    result = main(["--save-dir", str(tmp_path), "--model", "SFT=sft_s*", "--model", "SFT + RL=rl_s*",
                   "--train-length", "170", "--cost-of", "rl_s0", "--out", str(out)])
    table = out.with_suffix(".md").read_text()
    assert "| SFT + RL | 1 | 60.0 | 50.0* |" in table and "| SFT | 1 | 40.0 | 30.0 |" in table
    assert "* Evaluation cut before its end, items scored: rl_s0 21760 documents: 4." in table
    assert "from 8K to 1.00M: -10.0 points" in table
    # The cost table leaves the cut length out: how many items shared the engine is not known.
    assert "| 170 | 8192 | 4.0 |" in table and "| 21760 | 1048576 |" not in table
    seed = result["SFT + RL"]["21760"]["seeds"]["rl_s0"]
    assert seed["partial"] and seed["scored"] == 4 and seed["failed"] == 1 and seed["em"] == 25.0
    assert cut.read_text() == text
