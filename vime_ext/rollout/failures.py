"""What a rollout does when one sample goes wrong, instead of ending the run.

A plug-in that raises or hangs for one sample (``generate``, the reward, or a sample that fails validation)
fails that sample, with the exception's last line as its ``error``; an engine that dies aborts the samples it
was serving. Either way the sample's group no longer holds ``n_samples_per_prompt`` comparable answers, so GRPO
cannot give it a baseline: ``--failed-sample-policy regenerate`` (default) runs the group's bad samples once
more, ``drop`` (or a second failure) drops the group, whose samples then train nothing. The rollout, and the run,
stop with one message only when more than ``--max-failed-fraction`` of its samples FAILED (engine aborts do not
count: a restarted engine fixes those).
"""

import logging
from dataclasses import dataclass

from vime_ext.agent.sample import TRAINABLE, Sample, Status
from vime_ext.rollout.validate import RolloutError, where

log = logging.getLogger(__name__)
POLICIES = ("regenerate", "drop")


@dataclass(frozen=True)
class FailurePolicy:
    policy: str = "regenerate"
    max_failed_fraction: float = 0.5
    timeout_s: float | None = None  # per sample: generate and reward together

    @classmethod
    def from_args(cls, args) -> "FailurePolicy":
        return cls(args.failed_sample_policy, args.max_failed_fraction, args.rollout_sample_timeout or None)


def last_line(err: BaseException) -> str:
    """``Type: message``, the message's last line only (a traceback's last line says what went wrong)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__


def plugin_failure(sample: Sample, err: BaseException, timeout_s: float | None) -> Sample:
    """``sample`` marked FAILED by a plug-in's exception or its timeout; logged once, with the traceback."""
    if isinstance(err, TimeoutError) and timeout_s is not None:  # without a limit, a plug-in's own timeout
        reason = f"timed out after {timeout_s:g} s (--rollout-sample-timeout)"
    else:
        reason = last_line(err)
        log.warning("%s failed: %s", where(sample), reason, exc_info=err)
    return sample.fail(Status.FAILED, reason)


def needs_retry(group: list[Sample]) -> list[int]:
    """Positions of the group's samples that did not finish (FAILED or ABORTED)."""
    return [i for i, s in enumerate(group) if s.status not in TRAINABLE]


def drop_group(group: list[Sample]) -> None:
    """The group trains nothing: its finished samples are aborted too, naming the sample that sank it."""
    culprit = next(s for s in group if s.status not in TRAINABLE)
    reason = f"dropped with its group: {where(culprit)} {culprit.status.value}: {culprit.error}"
    for sample in group:
        if sample.status in TRAINABLE:
            sample.fail(Status.ABORTED, reason)


def check_failed_fraction(samples: list[Sample], max_fraction: float) -> None:
    failed = [s for s in samples if s.status == Status.FAILED]
    if samples and len(failed) / len(samples) > max_fraction:
        first = failed[0]
        raise RolloutError(f"{len(failed)} of {len(samples)} samples failed, more than --max-failed-fraction "
                           f"{max_fraction:g}; the first, {where(first)}: {first.error}")
