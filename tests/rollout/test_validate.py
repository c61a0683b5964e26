"""What a rollout returns is checked before training; each error names the sample (group, index) and the field."""

import math

import pytest

from vime_ext.agent.sample import Sample, Status, Turn
from vime_ext.rollout.rollout import apply_reward
from vime_ext.rollout.validate import RolloutError, check_groups, fold_trajectory


def done(group: int, index: int, response=(5, 6), reward=1.0, **fields) -> Sample:
    sample = Sample(prompt="p", group_index=group, index=index, tokens=[1, 2, *response],
                    response_length=len(response), loss_mask=[1] * len(response),
                    rollout_log_probs=[-0.5] * len(response), reward=reward, status=Status.COMPLETED)
    for name, value in fields.items():
        setattr(sample, name, value)
    return sample


def groups(n_groups=2, size=2, **change) -> list[list[Sample]]:
    """Valid groups; ``change`` = {(g, i): {field: value}} breaks one sample."""
    out = [[done(g, g * size + i) for i in range(size)] for g in range(n_groups)]
    for (g, i), fields in change.get("at", {}).items():
        for name, value in fields.items():
            setattr(out[g][i], name, value)
    return out


def test_valid_groups_pass():
    check_groups(groups(), 2, 2)
    failed = groups()
    failed[1][0] = Sample(prompt="p", group_index=1, index=2).fail(Status.FAILED, "too long")
    check_groups(failed, 2, 2)  # a failed sample needs no tokens or reward


@pytest.mark.parametrize("broken,message", [
    (lambda: groups(3), "returned 3 groups; --rollout-batch-size asks for 2"),
    (lambda: [groups()[0], groups()[1][:1]], "group 1 has 1 samples; --n-samples-per-prompt asks for 2"),
    (lambda: groups(at={(1, 1): {"index": 0}}),
     r"sample \(group 1, index 0\) sits at group 1, position 1: field group_index should be 1 and field index 3"),
    (lambda: groups(at={(0, 1): {"group_index": 1}}), r"field group_index should be 0 and field index 1"),
    (lambda: groups(at={(0, 1): {"loss_mask": [1]}}),
     r"sample \(group 0, index 1\): loss_mask has 1 entries but the response has 2 tokens"),
    (lambda: groups(at={(1, 0): {"rollout_log_probs": [-1.0, -1.0, -1.0]}}),
     r"sample \(group 1, index 2\): rollout_log_probs has 3 entries but the response has 2 tokens"),
    (lambda: groups(at={(1, 0): {"response_length": 4, "loss_mask": [1] * 4, "rollout_log_probs": [0.0] * 4}}),
     r"sample \(group 1, index 2\): tokens has 4 entries, not more than the 4 response tokens"),
    (lambda: groups(at={(0, 0): {"loss_mask": [0, 0]}}),
     r"sample \(group 0, index 0\): loss_mask is all 0: the sequence has no trainable token"),
    (lambda: groups(at={(0, 0): {"response_length": 0, "loss_mask": [], "rollout_log_probs": []}}),
     r"sample \(group 0, index 0\): loss_mask is all 0"),
    (lambda: groups(at={(1, 1): {"reward": math.nan}}), r"sample \(group 1, index 3\): field reward must be a "
                                                         r"finite number, got nan"),
    (lambda: groups(at={(1, 1): {"reward": "1"}}), r"field reward must be a finite number, got '1'"),
    (lambda: groups(at={(0, 1): {"reward": None}}), r"sample \(group 0, index 1\): field reward is None"),
    (lambda: groups(at={(0, 1): {"reward": {"score": 1.0}}}), r"field reward is a dict without a 'reward' entry"),
    (lambda: groups(at={(0, 1): {"metrics": {"turns": math.inf}}}),
     r"sample \(group 0, index 1\): field metrics\['turns'\] must be a finite number"),
    (lambda: groups(at={(0, 1): {"status": Status.PENDING}}), r"sample \(group 0, index 1\): field status is"),
    (lambda: [[done(0, 0), "not a sample"], groups()[1]], r"group 0, position 1: str where a Sample belongs"),
])
def test_each_mistake_is_named(broken, message):
    with pytest.raises(RolloutError, match=message):
        check_groups(broken(), 2, 2)


def test_a_bad_turn_inside_a_sample_is_named():
    sample = done(0, 0)
    sample.turns = [Turn([1, 2, 3], [1, 1], [-0.1, -0.2])]
    sample.turns[0].loss_mask = [1]  # broken after it was built
    with pytest.raises(RolloutError, match=r"sample \(group 0, index 0\), turns\[0\]: rollout_log_probs has 2"):
        check_groups([[sample, done(0, 1)]], 1, 2)


def test_a_list_from_generate_folds_into_one_trajectory():
    slot = Sample(prompt="p", group_index=1, index=5)
    first, second, last = (done(1, 5, response=(10 + k, 20 + k)) for k in range(3))
    first.metrics, last.metadata = {"chunks": 3.0}, {"answer": "x"}
    folded = fold_trajectory(slot, [first, second, last])
    assert folded.tokens == last.tokens and [t.tokens for t in folded.turns] == [first.tokens, second.tokens]
    assert folded.metrics == {"chunks": 3.0} and folded.metadata == {"answer": "x"}
    second.status, second.error = Status.FAILED, "engine refused"
    assert fold_trajectory(slot, [first, second, last]).status == Status.FAILED
    with pytest.raises(RolloutError, match=r"generate returned item 1 with field index 0 and group_index 0 for "
                                           r"sample \(group 1, index 5\); copy the slot's indices"):
        fold_trajectory(slot, [first, done(0, 0), last])
    with pytest.raises(RolloutError, match="generate returned an empty list"):
        fold_trajectory(slot, [])
    with pytest.raises(RolloutError, match="generate returned dict"):
        fold_trajectory(slot, {"tokens": []})


def test_rewards_are_numbers_or_dicts_with_metrics():
    sample = done(0, 0, reward=None)
    apply_reward(sample, {"reward": 0.5, "tool_errors": 2})
    assert sample.reward == 0.5 and sample.metrics == {"tool_errors": 2}
    with pytest.raises(RolloutError, match=r"sample \(group 0, index 0\): the reward must be a finite number"):
        apply_reward(sample, float("inf"))
    with pytest.raises(RolloutError, match="returned a dict without a 'reward' entry"):
        apply_reward(sample, {"score": 1})
