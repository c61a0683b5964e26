"""MemUpdate's settings: every key ``memup_<name>`` of ``--custom-config-path`` (``mem_update.yaml``; the launch
scripts fill it from ``MEMUP_*`` variables). The defaults, and why they differ from MemUpdate's published ones:

- ``size_cap`` None: the episode's own starting count. MemUpdate used a fixed 100, which LoCoMo's conversations
  (169-324 observations) all start above: size = max(0.1, 1 - (n - 100) / 100) is 0.1 for any n >= 190, so the
  reward of most episodes was cut to a tenth whatever the agent did. ``size_cap: 100`` restores it.
- everything else as published: size floor 0.1, density at most 1.2, change at least 0.8 with weight 0.5,
  efficiency clamped to [0.1, 1.5], retrieval top 5, at most 30 assistant turns per episode (verl's
  ``max_assistant_turns``), an unfinished episode rewarded like a finished one, -0.1 when the reward cannot be
  computed. ``unfinished_reward`` gives unfinished episodes a fixed reward instead (off by default).
"""

from dataclasses import dataclass

from examples.mem_update.retrieval import RETRIEVERS
from vime_ext.agent.settings import settings_from_args

SCORERS = ("proxy", "reader")
REWARD_QUESTIONS = ("seen", "unseen", "both")
REWARD_SIGNALS = ("qa", "likelihood")


@dataclass(frozen=True)
class MemUpdateSettings:
    retriever: str = "embedding"  # embedding | bm25: the search tool's and the QA scorers' retrieval
    top_k: int = 5  # memories retrieved for a question when it is scored
    max_turns: int = 30  # the policy's replies per episode; after the last one the episode ends unfinished
    max_context_tokens: int = 8192  # the whole episode (prompt, replies, tool results)
    scorer: str = "proxy"  # proxy: answer words found in the retrieved memories; reader: a model answers, F1
    # The reader is the policy (through the rollout's router) unless the run serves a fixed one, the reward model
    # (train.py --rm-hf-checkpoint, or --rm-url for one served elsewhere: then give its tokenizer here).
    reader_tokenizer: str | None = None  # HF dir; default --rm-hf-checkpoint
    reader_max_tokens: int = 32
    extra_questions: int = 0  # also score this many other questions of the same conversation (unseen by the agent)
    # Which questions the reward's QA is over: the one the agent was shown (seen), the others (unseen), or all
    # equally (both). Every episode logs the seen and the unseen QA apart whichever it is.
    reward_questions: str = "both"
    # What the reward's gain is measured in: qa (the scorer's QA, as published) or likelihood (the reader's
    # probability of the gold answer after its prompt: the geometric mean over the answer's tokens). F1 moves only
    # when the reader's greedy answer changes, so most GRPO groups tie; the likelihood moves with every edit that
    # makes the answer more or less likely. The QA metrics are the scorer's either way.
    reward_signal: str = "qa"
    size_cap: int | None = None  # None: the episode's starting memory count
    size_floor: float = 0.1
    density_max: float = 1.2
    change_floor: float = 0.8
    change_weight: float = 0.5
    efficiency_min: float = 0.1
    efficiency_max: float = 1.5
    unfinished_reward: float | None = None  # no final message (turn cap or token budget): None = scored as usual
    error_reward: float = -0.1  # when scoring raises (the reader's engine failed, the namespace is gone)
    first_reply_prefix: str = ""  # the policy's first reply starts with this (masked), e.g. an opened tool call
    # 1 or 0: SFT's demonstrations with or without their answer note (demonstrations.py --no-answer-note, set from
    # MEMUP_ANSWER_NOTE as the recipe's data is); the demonstrated row (baselines.py) plays the same episodes
    answer_note: int = 1
    # the consolidation sweep's searches (sweep.py): the swept row plays it with this many, and so do the
    # demonstrations (demonstrations.py --sweep-prompts, fewer where a chat is over the policy's context)
    sweep_searches: int = 5

    @classmethod
    def from_args(cls, args) -> "MemUpdateSettings":
        settings = settings_from_args(cls, args, "memup_")
        if settings.retriever not in RETRIEVERS:
            raise ValueError(f"memup_retriever {settings.retriever!r} is not one of {RETRIEVERS}")
        if settings.reward_questions not in REWARD_QUESTIONS:
            raise ValueError(f"memup_reward_questions {settings.reward_questions!r} is not one of {REWARD_QUESTIONS}")
        if settings.reward_questions == "unseen" and settings.extra_questions < 1:
            raise ValueError("memup_reward_questions unseen needs memup_extra_questions of 1 or more")
        if settings.scorer not in SCORERS:
            raise ValueError(f"memup_scorer {settings.scorer!r} is not one of {SCORERS}")
        if settings.reward_signal not in REWARD_SIGNALS:
            raise ValueError(f"memup_reward_signal {settings.reward_signal!r} is not one of {REWARD_SIGNALS}")
        if settings.reward_signal == "likelihood" and settings.scorer != "reader":
            raise ValueError("memup_reward_signal likelihood is the reader's probability of the answer: it needs "
                             "memup_scorer reader")
        if settings.scorer == "reader" and getattr(args, "rm_url", None) and not reader_tokenizer(settings, args):
            raise ValueError("--rm-url names the reader, a model served elsewhere; give its tokenizer (an HF dir) "
                             "as memup_reader_tokenizer")
        if min(settings.top_k, settings.max_turns, settings.max_context_tokens, settings.sweep_searches) < 1:
            raise ValueError("memup_top_k, memup_max_turns, memup_max_context_tokens and memup_sweep_searches must "
                             "be positive")
        if settings.efficiency_min > settings.efficiency_max:
            raise ValueError("memup_efficiency_min is above memup_efficiency_max")
        if settings.answer_note not in (0, 1):
            raise ValueError(f"memup_answer_note {settings.answer_note!r} is not 0 or 1")
        return settings


def reader_tokenizer(settings: MemUpdateSettings, args) -> str | None:
    """The fixed reader's tokenizer: the setting's, else the reward model's checkpoint."""
    return settings.reader_tokenizer or getattr(args, "rm_hf_checkpoint", None)
