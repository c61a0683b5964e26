"""tools/rollout_replies.py: saved rollouts written again as readable samples, without their token lists."""

import json
import lzma

import pytest

from tools.rollout_replies import main
from vime_ext.agent.sample import Sample, Status, Turn
from vime_ext.rollout.debug_data import save_rollout, saved_rollout_ids


def a_group(rollout_id: int, rewards: list[float]) -> list[Sample]:
    """A group of finished two-turn samples, as a multi-turn plug-in leaves them."""
    group = []
    for i, reward in enumerate(rewards):
        turn = Turn(tokens=[1, 2, 3, 4], loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.25])
        group.append(Sample(prompt=f"q{rollout_id}", index=i, label="a", tokens=[1, 2, 3, 4, 5, 6],
                            response=f"reply {rollout_id}.{i}", response_length=3, loss_mask=[1, 0, 1],
                            rollout_log_probs=[-0.1, 0.0, -0.2], reward=reward, status=Status.COMPLETED,
                            turns=[turn], metadata={"memories": ["m1"]}, metrics={"tool_calls": 2.0}))
    return group


def test_first_and_last_rollouts_come_back_without_token_lists(tmp_path):
    folder = tmp_path / "rollouts"
    for rollout_id in (0, 1, 2, 10):  # 10 after 2: ids are numbers, not names
        save_rollout(str(folder), rollout_id, [a_group(rollout_id, [0.0, 1.0])], {"rollout/reward_mean": 0.5})
    (folder / "rollout_11.json.partial").write_text("{")  # a save cut short is not a saved rollout
    assert saved_rollout_ids(str(folder)) == [0, 1, 2, 10]

    out = tmp_path / "replies.jsonl.xz"
    summary = main([str(folder), "--out", str(out)])
    assert [row["rollout_id"] for row in summary] == [0, 10]
    assert summary[0] == {"rollout_id": 0, "samples": 2, "reward_mean": 0.5, "statuses": {"completed": 2}}
    rows = [json.loads(line) for line in lzma.open(out, "rt")]
    assert [(r["rollout_id"], r["response"]) for r in rows] == [(0, "reply 0.0"), (0, "reply 0.1"),
                                                               (10, "reply 10.0"), (10, "reply 10.1")]
    for row in rows:
        assert not {"tokens", "loss_mask", "rollout_log_probs", "token_versions", "turns"} & set(row)
        assert row["metadata"] == {"memories": ["m1"]} and row["metrics"] == {"tool_calls": 2.0}
        assert row["reward"] in (0.0, 1.0) and row["status"] == "completed"


def test_named_rollouts_by_pattern_and_a_missing_one_is_an_error(tmp_path):
    pattern = str(tmp_path / "r_{rollout_id}.json")
    for rollout_id in (3, 4):
        save_rollout(pattern, rollout_id, [a_group(rollout_id, [0.25])], {})
    assert saved_rollout_ids(pattern) == [3, 4]
    out = tmp_path / "replies.jsonl"
    assert [row["rollout_id"] for row in main([pattern, "--out", str(out), "--rollouts", "all"])] == [3, 4]
    assert len(out.read_text().splitlines()) == 2
    assert [row["rollout_id"] for row in main([pattern, "--out", str(out), "--rollouts", "4"])] == [4]
    with pytest.raises(SystemExit, match=r"'5' is not a saved rollout \(saved: \[3, 4\]\)"):
        main([pattern, "--out", str(out), "--rollouts", "3,5"])
    with pytest.raises(SystemExit, match="no saved rollout there"):
        main([str(tmp_path / "elsewhere"), "--out", str(out)])
