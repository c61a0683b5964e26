"""One trajectory as the rollout produces it and the trainer consumes it."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


def sequence_problem(tokens: list[int], response_length: int, loss_mask: list[int],
                     log_probs: list[float]) -> str | None:
    """What is wrong with one training sequence (prompt + response tokens, mask and log-probs over the
    response), naming the field; None when it can train."""
    if len(loss_mask) != response_length:
        return f"loss_mask has {len(loss_mask)} entries but the response has {response_length} tokens"
    if len(log_probs) != response_length:
        return f"rollout_log_probs has {len(log_probs)} entries but the response has {response_length} tokens"
    if response_length >= len(tokens):
        return (f"tokens has {len(tokens)} entries, not more than the {response_length} response tokens (the "
                "prompt needs at least one)")
    if any(m not in (0, 1) for m in loss_mask):
        return "loss_mask holds values other than 0 and 1"
    if not any(loss_mask):
        return "loss_mask is all 0: the sequence has no trainable token"
    return None


class Status(str, Enum):
    PENDING = "pending"
    COMPLETED = "completed"  # the model stopped by itself (EOS or a stop string)
    TRUNCATED = "truncated"  # hit the response-length limit
    ABORTED = "aborted"  # cancelled by the framework (e.g. a weight update or a dead engine); may be retried
    FAILED = "failed"  # cannot succeed as asked (bad input); ``error`` says why


TRAINABLE = (Status.COMPLETED, Status.TRUNCATED)  # the statuses a sample trains with


@dataclass
class Turn:
    """One training sequence cut from a multi-turn trajectory: its tokens and which of them are trained on."""

    tokens: list[int]
    loss_mask: list[int]
    rollout_log_probs: list[float]
    token_versions: list[int | None] = field(default_factory=list)  # as Sample.token_versions

    def __post_init__(self):
        # Checked here, where a plug-in builds it, rather than when the trainer meets it.
        problem = sequence_problem(self.tokens, len(self.loss_mask), self.loss_mask, self.rollout_log_probs)
        if problem:
            raise ValueError(f"Turn: {problem}")


@dataclass
class Sample:
    """A prompt and what the policy did with it.

    ``tokens`` is prompt + response; ``loss_mask`` and ``rollout_log_probs`` cover the response only (tool
    outputs inside a response are masked with 0). ``turns`` holds extra training sequences when one trajectory
    trains as several (MemAgent trains every chunk's memory update as its own sequence).
    """

    prompt: str | list[dict[str, Any]]
    index: int = 0
    group_index: int = 0
    label: Any = None
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] = field(default_factory=list)
    rollout_log_probs: list[float] = field(default_factory=list)
    reward: float | dict[str, float] | None = None
    status: Status = Status.PENDING
    error: str | None = None
    weight_version: int | None = None  # the oldest weight version that sampled any of its tokens
    # Per response token: the weight version that sampled it, None for masked tokens; empty unless recorded
    # (--partial-rollout, where a push can land mid-reply)
    token_versions: list[int | None] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Scalars a plug-in reports per sample (turns, tool errors, memory size, ...): averaged per rollout and
    # logged as rollout/<name>. A dict reward's entries other than "reward" land here too.
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def fail(self, status: Status, reason: str) -> "Sample":
        """Mark the sample as not usable for training, keeping the reason."""
        if status not in (Status.FAILED, Status.ABORTED):
            raise ValueError(f"fail() takes FAILED or ABORTED, not {status}")
        self.status, self.error = status, reason
        return self
