"""Checks of what a rollout returns, before anything trains on it. Every error names the sample (group and
index) and the field, so a plug-in's mistake is found where it was made, not as a shape error in the trainer."""

import math
from dataclasses import fields

from vime_ext.agent.sample import TRAINABLE, Sample, Status, sequence_problem


class RolloutError(ValueError):
    """A rollout or generate function returned something the trainer cannot use."""


def where(sample: Sample) -> str:
    source = sample.metadata.get("source") if isinstance(sample.metadata, dict) else None
    return f"sample (group {sample.group_index}, index {sample.index}{', ' + source if source else ''})"


def check_number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RolloutError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def check_sample(sample: Sample, evaluation: bool = False) -> None:
    """One trajectory: its sequences' lengths and masks, its reward and metrics (trainable samples only). In
    ``evaluation`` a sample may hold no sequence at all: an evaluated baseline that asks no model (MemUpdate's
    doing-nothing edit) is scored but never trained on."""
    if not isinstance(sample, Sample):
        raise RolloutError(f"a rollout returned {type(sample).__name__} where a Sample belongs")
    if not isinstance(sample.status, Status) or sample.status == Status.PENDING:
        raise RolloutError(f"{where(sample)}: field status is {sample.status!r}; a finished sample is COMPLETED, "
                           "TRUNCATED, ABORTED or FAILED")
    if sample.status not in TRAINABLE:
        return
    no_sequence = evaluation and not sample.tokens and not sample.turns
    if (sample.response_length or not sample.turns) and not no_sequence:
        problem = sequence_problem(sample.tokens, sample.response_length, sample.loss_mask,
                                   sample.rollout_log_probs)
        if problem:
            raise RolloutError(f"{where(sample)}: {problem}")
    for i, turn in enumerate(sample.turns):
        problem = sequence_problem(turn.tokens, len(turn.loss_mask), turn.loss_mask, turn.rollout_log_probs)
        if problem:
            raise RolloutError(f"{where(sample)}, turns[{i}]: {problem}")
    reward = sample.reward
    if isinstance(reward, dict):
        if "reward" not in reward:
            raise RolloutError(f"{where(sample)}: field reward is a dict without a 'reward' entry: {list(reward)}")
        reward = reward["reward"]
    if reward is None:
        raise RolloutError(f"{where(sample)}: field reward is None though the sample finished "
                           f"({sample.status.value}); the reward function returned nothing")
    try:
        check_number(reward, "field reward")
        for name, value in sample.metrics.items():
            check_number(value, f"field metrics[{name!r}]")
    except RolloutError as err:
        raise RolloutError(f"{where(sample)}: {err}") from None


def check_groups(groups, num_groups: int | None, group_size: int) -> None:
    """Group count and sizes, indices (``group_index`` = g, ``index`` = g x group_size + i: the trainer cuts
    optimizer steps by index), then every sample. ``num_groups`` None: any count."""
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        raise RolloutError(f"a rollout must return a list of groups (lists of Samples), got {type(groups).__name__}")
    if num_groups is not None and len(groups) != num_groups:
        raise RolloutError(f"the rollout returned {len(groups)} groups; --rollout-batch-size asks for {num_groups}")
    for g, group in enumerate(groups):
        if len(group) != group_size:
            raise RolloutError(f"group {g} has {len(group)} samples; --n-samples-per-prompt asks for {group_size}")
        for i, sample in enumerate(group):
            if not isinstance(sample, Sample):
                raise RolloutError(f"group {g}, position {i}: {type(sample).__name__} where a Sample belongs")
            if sample.group_index != g or sample.index != g * group_size + i:
                raise RolloutError(f"{where(sample)} sits at group {g}, position {i}: field group_index should be "
                                   f"{g} and field index {g * group_size + i}")
            check_sample(sample)


def fold_trajectory(slot: Sample, returned) -> Sample:
    """What ``generate`` returned for ``slot``, as one Sample: itself, or (a list: the multi-sequence form, one
    training sequence each, one reward for the trajectory) the last sample with the earlier ones as ``turns``.
    Returned samples must keep the slot's ``index`` and ``group_index``."""
    samples = returned if isinstance(returned, list) else [returned]
    if not samples:
        raise RolloutError(f"generate returned an empty list for {where(slot)}")
    for k, sample in enumerate(samples):
        if not isinstance(sample, Sample):
            raise RolloutError(f"generate returned {type(sample).__name__} (item {k}) for {where(slot)}; expected "
                               "a Sample or a list of Samples")
        if (sample.index, sample.group_index) != (slot.index, slot.group_index):
            raise RolloutError(f"generate returned item {k} with field index {sample.index} and group_index "
                               f"{sample.group_index} for {where(slot)}; copy the slot's indices "
                               "(dataclasses.replace(sample, ...) does)")
    if len(samples) == 1:
        return samples[0]
    from vime_ext.agent.sample import Turn

    last = samples[-1]
    bad = next((s for s in samples if s.status not in TRAINABLE), None)
    turns = []
    for k, sample in enumerate(samples[:-1]):
        if sample.status in TRAINABLE:
            if sample.response_length:
                problem = sequence_problem(sample.tokens, sample.response_length, sample.loss_mask,
                                           sample.rollout_log_probs)
                if problem:
                    raise RolloutError(f"{where(slot)}, sequence {k} of {len(samples)}: {problem}")
                turns.append(Turn(list(sample.tokens), list(sample.loss_mask), list(sample.rollout_log_probs),
                                  list(sample.token_versions)))
            turns.extend(sample.turns)
    folded = Sample(**{f.name: getattr(last, f.name) for f in fields(Sample)})
    folded.turns = turns + list(last.turns)
    folded.metadata = {k: v for s in samples for k, v in s.metadata.items()}
    folded.metrics = {k: v for s in samples for k, v in s.metrics.items()}
    if bad is not None and bad is not last:
        folded.status, folded.error = bad.status, f"sequence {samples.index(bad)} of {len(samples)}: {bad.error}"
    return folded
