"""Rollout Samples -> training sequences with advantages.

A sequence's ``loss_mask`` and ``rollout_log_probs`` are aligned with its targets ``tokens[1:]`` (position t
scores token t+1), so prompt tokens carry mask 0; a sequence ends at its last trained token. A Sample trains as
its main sequence plus one sequence per ``Turn``. With GRPO every sequence of a trajectory of n sequences gets
the trajectory's advantage A (``--trajectory-advantage shared``) or A / n (``split``); with PPO each sequence's
last generated token gets the trajectory's reward and GAE runs within the sequence. Failed or aborted samples
train on nothing, but their groups still count them with reward 0 (an engine error must not look like a good
answer).

Per-sequence weight in the loss: with the default ``--loss-aggregation token_mean`` a sequence weighs by its
trained tokens times its advantage, so under ``shared`` a trajectory of n sequences pulls about n times as hard
as a one-sequence trajectory with the same advantage; ``split`` makes every trajectory pull the same in total
(each of its sequences 1/n), as vime's MemAgent and Flow-GRPO do.
"""

from dataclasses import dataclass

import torch

from vime_ext.agent.sample import TRAINABLE, Sample
from vime_ext.algorithms.advantages import grpo_advantages


@dataclass
class TrainSequence:
    tokens: list[int]
    loss_mask: list[int]  # len(tokens) - 1, aligned with tokens[1:]
    rollout_log_probs: list[float]  # same alignment; 0.0 where the mask is 0
    advantage: float
    sample_index: int
    reward: float | None = None  # the trajectory's scalar reward; PPO's GAE needs it

    def __post_init__(self):
        n = len(self.tokens) - 1
        if n < 1 or len(self.loss_mask) != n or len(self.rollout_log_probs) != n:
            raise ValueError(f"sample {self.sample_index}: a training sequence of {len(self.tokens)} tokens needs "
                             f"{n} mask entries and log-probs, got {len(self.loss_mask)} and "
                             f"{len(self.rollout_log_probs)}")

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def scalar_reward(sample: Sample) -> float:
    if sample.status not in TRAINABLE:
        return 0.0
    if isinstance(sample.reward, dict):
        if "reward" not in sample.reward:
            raise ValueError(f"sample {sample.index}: a dict reward needs a 'reward' entry, got {list(sample.reward)}")
        return float(sample.reward["reward"])
    if sample.reward is None:
        raise ValueError(f"sample {sample.index} ({sample.metadata.get('source', 'no source')}) finished with "
                         f"status {sample.status.value} but has no reward; the reward function returned None")
    return float(sample.reward)


def compute_advantages(samples: list[Sample], group_size: int, normalize_std: bool = True) -> torch.Tensor:
    """GRPO advantages for samples ordered group by group."""
    rewards = torch.tensor([scalar_reward(s) for s in samples], dtype=torch.float32)
    return grpo_advantages(rewards, group_size, normalize_std=normalize_std)


def _response_sequence(tokens: list[int], loss_mask: list[int], log_probs: list[float], advantage: float,
                       index: int, reward: float) -> TrainSequence:
    prompt_length = len(tokens) - len(loss_mask)
    if prompt_length < 1:
        raise ValueError(f"sample {index}: {len(loss_mask)} response tokens but only {len(tokens)} tokens in all")
    pad = prompt_length - 1
    mask, log_probs = [0] * pad + list(loss_mask), [0.0] * pad + list(log_probs)
    # Tokens after the last trained one (a tool's answer to an episode's last call, appended before the episode
    # hit its length cap) change no loss or log-prob of a trained token: they are cut, so a sequence is no longer
    # than its last reply's context (an episode's bound), which the micro-batch budget is sized to.
    last = max((i for i, m in enumerate(mask) if m), default=len(mask) - 1)
    return TrainSequence(list(tokens[:last + 2]), mask[:last + 1], log_probs[:last + 1], advantage, index, reward)


def trajectory_sequences(sample: Sample, advantage: float, reward: float) -> list[TrainSequence]:
    """The training sequences of one trajectory: the main response (if any), then each turn."""
    sequences = []
    if sample.response_length:
        sequences.append(_response_sequence(sample.tokens, sample.loss_mask, sample.rollout_log_probs,
                                            advantage, sample.index, reward))
    for turn in sample.turns:
        sequences.append(_response_sequence(turn.tokens, turn.loss_mask, turn.rollout_log_probs, advantage,
                                            sample.index, reward))
    return sequences


def samples_to_train_data(args, samples: list[Sample]) -> list[TrainSequence]:
    """The default converter (``--custom-convert-samples-to-train-data-path`` replaces it): GRPO advantages
    over each group (PPO: 0, the critic's GAE replaces them; SFT: 0, unused), shared or split over a trajectory's
    sequences."""
    if args.advantage_estimator == "ppo" or args.loss_type == "sft_loss":  # the critic's GAE, or no advantage
        advantages = torch.zeros(len(samples))
    else:
        advantages = compute_advantages(samples, args.n_samples_per_prompt,
                                        not args.disable_grpo_std_normalization)
    sequences = []
    for sample, advantage in zip(samples, advantages.tolist()):
        if sample.status not in TRAINABLE:
            continue
        mine = trajectory_sequences(sample, advantage, scalar_reward(sample))
        if args.trajectory_advantage == "split":
            for seq in mine:
                seq.advantage = advantage / len(mine)
        sequences.extend(mine)
    return sequences
