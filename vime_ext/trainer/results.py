"""What a trainer rank returns to the driver across the Ray boundary: the same dataclass from every rank, with
``reports`` saying whether its figures count (the last pipeline stage's tensor-parallel rank 0 reports; the
others computed the same loss or none)."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankLayout:
    """Where a rank sits in the parallel layout, and on which device type."""

    rank: int
    dp_rank: int
    tp_rank: int
    pp_rank: int
    last_stage: bool
    dp_size: int
    device: str

    @property
    def reports(self) -> bool:
        return self.last_stage and self.tp_rank == 0


@dataclass(frozen=True)
class LogProbMismatch:
    """|trainer - engine| log-prob over the loss tokens of a rank's share: sum, largest, token count."""

    abs_sum: float = 0.0
    abs_max: float = 0.0
    tokens: float = 0.0


@dataclass
class StepResult:
    """One rollout's training on one rank: the seconds of the forward-only passes (old log-probs, unless the
    rollout trains in one step, and reference log-probs) and of the optimizer steps, and (reporting ranks) the
    trained tokens, the engine mismatch (None for SFT) and per optimizer step the statistics' weighted sums."""

    reports: bool
    log_prob_time: float
    train_time: float
    tokens: int = 0
    mismatch: LogProbMismatch | None = None
    steps: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class LossSum:
    """A forward-only pass's summed negative log-likelihood over the trained tokens and their count; zeros from
    ranks that do not report, so the driver adds every rank's."""

    nll: float = 0.0
    tokens: float = 0.0
