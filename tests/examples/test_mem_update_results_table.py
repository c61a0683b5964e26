"""examples/mem_update/results_table.py on summaries shaped as eval_mem_update writes them: seeds averaged with
their range, the calls per tool, the scorer named, the goal checked."""

import json

from examples.mem_update.eval_mem_update import TOOL_NAMES
from examples.mem_update.results_table import main


def summary(qa_before, qa_after, reward, calls):
    return {"model": "m", "scorer": "reader /models/SmolLM2", "episodes": 64, "qa_before": qa_before,
            "qa_after": qa_after, "qa_delta": qa_after - qa_before, "qa_delta_seen": qa_after - qa_before,
            "qa_delta_unseen": (qa_after - qa_before) / 2, "reward": reward, "failed": 0.0,
            "unfinished": 0.25, "tool_calls": calls + 1, "tool_errors": 1.0, "valid_tool_calls": calls,
            "store_edits": 2.0, "initial_memory_count": 32.0, "final_memory_count": 33.0,
            "initial_memory_chars": 1000.0, "final_memory_chars": 1100.0,
            "calls_per_tool": {name: (calls if name == "search_memory" else 0.0) for name in TOOL_NAMES},
            "errors_per_kind": {"format": 1.0, "unknown_tool": 0.0, "arguments": 0.0, "tool": 0.0}}


def test_seeds_are_averaged_and_the_goal_is_checked(tmp_path):
    results = {"base": summary(0.30, 0.30, 0.0, 0.0), "sft_s0": summary(0.30, 0.34, 0.04, 3.0),
               "sft_s1": summary(0.30, 0.36, 0.06, 5.0), "rl_s0": summary(0.30, 0.40, 0.10, 4.0),
               "rl_s1": summary(0.30, 0.44, 0.14, 6.0)}
    for name, s in results.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(s))
    (tmp_path / "rl_s0.samples.jsonl").write_text("{}\n")  # the episodes file beside it is not a summary
    out = tmp_path / "table/mem_update"
    result = main(["--results", str(tmp_path), "--model", "base=base", "--model", "SFT=sft_s*",
                   "--model", "SFT + RL=rl_s*", "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    # QA before, after, delta, delta on the seen question, on the unseen ones, reward
    assert ("| SFT | 2 | 64 | 0.300 | 0.350 (0.340-0.360) | 0.050 (0.040-0.060) | 0.050 (0.040-0.060) | "
            "0.025 (0.020-0.030) | 0.050 (0.040-0.060) |") in text
    assert "| SFT + RL | 2 | 64 | 0.300 | 0.420 (0.400-0.440) | 0.120 (0.100-0.140) |" in text
    assert "| base | 1 | 64 | 0.00 | 0.00 | 0.00 |" in text  # calls per tool: search, manage, delete, ...
    assert "| SFT + RL | 2 | 64 | 5.00 (4.00-6.00) | 0.00 |" in text
    assert "QA scored by: reader /models/SmolLM2." in text
    assert "Failed calls per episode by what was wrong:" in text
    assert "| SFT | 2 | 64 | 1.00 | 0.00 | 0.00 | 0.00 |" in text
    assert "- SFT + RL against SFT, qa_delta: 0.120 against 0.050 (above; goal: above)." in text
    assert "- SFT + RL against SFT, reward: 0.120 against 0.050 (above; goal: above)." in text
    assert sorted(result["SFT"]["seeds"]) == ["sft_s0", "sft_s1"]
    assert json.loads(out.with_suffix(".json").read_text())["SFT + RL"]["means"]["valid_tool_calls"] == 5.0
