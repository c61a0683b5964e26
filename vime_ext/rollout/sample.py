"""One trajectory as the rollout produces it and the trainer consumes it."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    PENDING = "pending"
    COMPLETED = "completed"  # the model stopped by itself (EOS or a stop string)
    TRUNCATED = "truncated"  # hit the response-length limit
    ABORTED = "aborted"  # cancelled by the framework (e.g. a weight update or a dead engine); may be retried
    FAILED = "failed"  # cannot succeed as asked (bad input); ``error`` says why


@dataclass
class Turn:
    """One training sequence cut from a multi-turn trajectory: its tokens and which of them are trained on."""

    tokens: list[int]
    loss_mask: list[int]
    rollout_log_probs: list[float]

    def __post_init__(self):
        if len(self.loss_mask) != len(self.rollout_log_probs):
            raise ValueError(f"turn: loss_mask has {len(self.loss_mask)} entries, rollout_log_probs "
                             f"{len(self.rollout_log_probs)}; both cover the response tokens")


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
    weight_version: int | None = None
    turns: list[Turn] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def fail(self, status: Status, reason: str) -> "Sample":
        """Mark the sample as not usable for training, keeping the reason."""
        if status not in (Status.FAILED, Status.ABORTED):
            raise ValueError(f"fail() takes FAILED or ABORTED, not {status}")
        self.status, self.error = status, reason
        return self
