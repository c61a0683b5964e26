"""tools/scaling_table.py names what it cannot use: a broken metrics line, a run too short for the table."""

import json

import pytest

from tools.scaling_table import COLUMNS, read_run, table

LAYOUT = {"gpus": 2, "actor_gpus": 1, "rollout_gpus": 1, "tp": 1}


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_medians_leave_out_the_first_rollout_and_ratios_follow_the_first_run(tmp_path):
    rows = [{"step": i, **{key: value for key, _ in COLUMNS}} for i, value in enumerate([100.0, 2.0, 4.0, 3.0])]
    rows.insert(2, {"step": 1, "eval/x/reward_mean": 0.5})  # an evaluation line: no step figures
    small = read_run(LAYOUT, write_rows(tmp_path / "a.jsonl", rows))
    assert small["rollouts"] == 3 and set(small["figures"].values()) == {3.0}
    doubled = {**small, "gpus": 4, "figures": {key: 2 * value for key, value in small["figures"].items()}}
    lines = table([small, doubled]).splitlines()
    assert lines[2].startswith("| 2 | 1 (TP 1) / 1 | 3.0 (1.00x)")
    assert lines[3].startswith("| 4 | 1 (TP 1) / 1 | 6.0 (2.00x)")


def test_bad_input_is_named(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"step": 0}\n{"step": 1,\n')
    with pytest.raises(ValueError, match=r"broken.jsonl:2: not valid JSON"):
        read_run(LAYOUT, broken)
    one = write_rows(tmp_path / "one.jsonl", [{"step": 0, **{key: 1.0 for key, _ in COLUMNS}}])
    with pytest.raises(ValueError, match="1 training rollouts; the table needs 2 or more"):
        read_run(LAYOUT, one)
