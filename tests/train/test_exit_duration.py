"""--exit-duration-in-mins: the step the run stops after is the step it saves.

The whole path (a run that stops, saves and resumes) runs in tests/train/test_sft.py with a limit of 0, which
every step is past. Here the limit is crossed inside a step, between the save's question (after training) and
the loop's (after the hand-over and the logging): on 2 x H200 both runs of a sweep stopped there unsaved
(2026-12-01), because the loop read the clock again."""

import json

import pytest

from vime_ext.arguments import parse_train_args
from vime_ext.driver import recovery as recovery_module
from vime_ext.driver.recovery import Recovery


@pytest.fixture
def flags(tiny_hf_dirs, tmp_path) -> list[str]:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1 =", "label": "2"}) + "\n")
    return ["--hf-checkpoint", str(tiny_hf_dirs["qwen3"]), "--prompt-data", str(data)]


def test_the_limit_crossed_after_a_step_saved_stops_after_the_next_one(flags, monkeypatch):
    now = [0.0]
    monkeypatch.setattr(recovery_module.time, "monotonic", lambda: now[0])
    config = parse_train_args(flags + ["--exit-duration-in-mins", "1"])
    recovery = Recovery(config, cluster=None, handover=None, started=0.0)
    now[0] = 59.0  # rollout 3 has trained: the save asks, one second before the limit
    assert not recovery.out_of_time(3)
    now[0] = 61.0  # the hand-over and the logging took two seconds: the loop asks past the limit
    assert not recovery.out_of_time(3)  # the save's answer: the loop goes on, to a step that saves
    assert recovery.out_of_time(4) and recovery.out_of_time(4)  # the next step stops, its save and loop agree
    assert not recovery.out_of_time(5)  # decided once


def test_without_a_limit_no_step_is_the_last(flags, monkeypatch):
    monkeypatch.setattr(recovery_module.time, "monotonic", lambda: 1e9)
    recovery = Recovery(parse_train_args(flags), cluster=None, handover=None, started=0.0)
    assert not any(recovery.out_of_time(i) for i in range(3))


def test_the_lineage_counts_rollouts_whose_step_the_weights_hold_twice():
    """What the run logs from the rollouts its weights hold (saved with each checkpoint, restored with it; the
    resume and restart tests in test_train_loop.py check the whole path): a rollout trained again on weights that
    already hold its step counts once in ``rollouts_trained_twice``; an older checkpoint's unknown lineage logs
    nothing rather than a wrong count."""
    from vime_ext.driver.recovery import lineage_metrics

    assert lineage_metrics([0, 1, 2, 3]) == {"train/rollouts_in_weights": 4.0, "train/rollouts_trained_twice": 0.0}
    assert lineage_metrics([0, 1, 1, 2]) == {"train/rollouts_in_weights": 3.0, "train/rollouts_trained_twice": 1.0}
    assert lineage_metrics([]) == {"train/rollouts_in_weights": 0.0, "train/rollouts_trained_twice": 0.0}
    assert lineage_metrics(None) == {}
