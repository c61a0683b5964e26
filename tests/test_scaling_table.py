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


def test_the_sharing_table_sums_the_hand_over_and_leaves_the_save_out(tmp_path):
    """tools/sharing_table.py: per-phase medians after the first rollout; the hand-over is the sleep, reload,
    offload and wake-up together; a step's save is not part of its step."""
    from tools.sharing_table import main, phase_medians

    step = {"time/rollout": 10.0, "time/log_probs": 1.0, "time/train": 5.0, "time/sleep": 0.5, "time/reload": 1.0,
            "time/offload": 2.0, "time/wake_up": 0.5, "time/weight_sync": 0.4, "time/total": 20.0}
    rows = [{**step, "time/total": 90.0}, step, {**step, "time/save": 30.0, "time/total": 50.0}]
    colocated = write_rows(tmp_path / "colocated.jsonl", rows)
    assert phase_medians(colocated) == {"rollout s": 10.0, "log-probs s": 1.0, "train s": 5.0, "hand-over s": 4.0,
                                        "push s": 0.4, "step s": 20.0}
    apart = write_rows(tmp_path / "apart.jsonl", [{"time/rollout": 8.0, "time/total": 10.0}] * 2)
    assert phase_medians(apart)["hand-over s"] == 0.0  # engines on GPUs of their own hand nothing over
    with pytest.raises(SystemExit):
        main([str(colocated)])  # no label


def test_the_sharing_table_prints_one_row_per_run(tmp_path, capsys):
    from tools.sharing_table import main

    row = {"time/rollout": 4.0, "time/total": 10.0}
    main([f"x, 2 GPUs={write_rows(tmp_path / 'x.jsonl', [row, row])}",
          f"y={write_rows(tmp_path / 'y.jsonl', [row, {**row, 'time/total': 5.0}])}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| x, 2 GPUs | 4.00 |") and lines[2].endswith("| 10.00 | 1.00x |")
    assert lines[3].endswith("| 5.00 | 2.00x |")
    # A run that died after its first rollout (4 x H100, out of memory) is a row saying so, not the table's end.
    main([f"died={write_rows(tmp_path / 'died.jsonl', [row])}", f"x={write_rows(tmp_path / 'x.jsonl', [row, row])}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| died | ") and "1 training rollouts" in lines[2]
    assert lines[3].endswith("| 10.00 | 1.00x |")
