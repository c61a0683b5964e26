"""The trainer ranks' side of one rollout: the samples made into train sequences (the plug-in converter), split
into optimizer steps and data-parallel shares, trained, and summed into the step's metrics; and, for SFT, the
loss on an evaluation set. The loop (``loop.py``) decides when, and hands the GPUs over around it."""

from dataclasses import dataclass

import numpy as np

from vime_ext.agent.sample import TRAINABLE, Sample
from vime_ext.algorithms.train_data import TrainSequence
from vime_ext.arguments import TrainConfig
from vime_ext.driver.cluster import Cluster
from vime_ext.rollout.plugins import load_function
from vime_ext.rollout.validate import RolloutError
from vime_ext.trainer.batching import split_data_parallel

# Optimizer figures: the same on every rank (or, the state's trip back, alike), so not summed over data-parallel
# shares.
_PER_STEP = ("grad_norm", "lr", "skipped", "state_restore_s", "critic_grad_norm", "critic_lr", "critic_skipped",
             "critic_state_restore_s")


def plan_steps(config: TrainConfig, samples: list[Sample], sequences: list[TrainSequence],
               dp_size: int) -> tuple[list[list[list[TrainSequence]]], list[tuple[float, float]]]:
    """Per data-parallel rank, the sequences of each optimizer step; and each step's (loss tokens, sequences).
    A step whose samples all failed or were dropped with their groups has nothing to train and is left out."""
    position = {s.index: i for i, s in enumerate(samples)}
    steps: list[list[TrainSequence]] = [[] for _ in range(config.steps_per_rollout)]
    for seq in sequences:
        if seq.sample_index not in position:
            raise RolloutError(f"the samples-to-train-data converter made a sequence for sample index "
                               f"{seq.sample_index}, which is not in this rollout")
        steps[position[seq.sample_index] // config.global_batch_size].append(seq)
    steps = [step for step in steps if step]
    per_rank = [[] for _ in range(dp_size)]
    for step in steps:
        for rank, share in enumerate(split_data_parallel(step, dp_size)):
            per_rank[rank].append(share)
    totals = [(float(sum(s.num_loss_tokens for s in step)), float(len(step))) for step in steps]
    return per_rank, totals


@dataclass
class Plan:
    """One rollout's train sequences and their optimizer steps (``plan_steps``)."""
    sequences: list[TrainSequence]
    per_rank: list[list[list[TrainSequence]]]
    totals: list[tuple[float, float]]  # per step: loss tokens, sequences


class StepTrainer:
    def __init__(self, config: TrainConfig, cluster: Cluster):
        self.config = config
        self.cluster = cluster
        self.args = config.plugin_args()
        self.convert = load_function(config.rollout.custom_convert_samples_to_train_data_path,
                                     "--custom-convert-samples-to-train-data-path")
        layouts = cluster.layouts
        self.dp_size = layouts[0].dp_size if layouts else 1
        self.dp_rank = [layout.dp_rank for layout in layouts]

    def plan(self, samples: list[Sample]) -> Plan:
        sequences = self.convert(self.args, samples)
        if not isinstance(sequences, list) or not all(isinstance(q, TrainSequence) for q in sequences):
            raise RolloutError("the samples-to-train-data converter must return a list of TrainSequence")
        return Plan(sequences, *plan_steps(self.config, samples, sequences, self.dp_size))

    def train(self, plan: Plan, rollout_id: int) -> list:
        """The plan's optimizer steps on the trainer ranks (each its data-parallel share); their reports."""
        update_policy = rollout_id >= self.config.algorithm.num_critic_only_steps
        return self.cluster.ranks.train_rollout([plan.per_rank[r] for r in self.dp_rank], plan.totals,
                                                update_policy)

    def metrics(self, plan: Plan, results: list, times: dict[str, float]) -> dict[str, float]:
        """``train/*`` over the ranks' reports (``times`` gets the log-prob and train seconds)."""
        reported = [r for r in results if r.reports]
        times["log_probs"] = max(r.log_prob_time for r in results)
        times["train"] = max(r.train_time for r in results)
        train_tokens = sum(r.tokens for r in reported)
        metrics = {"train/sequences": float(len(plan.sequences)), "train/steps": float(len(plan.totals)),
                   "train/tokens_per_s": train_tokens / max(times["train"], 1e-9)}
        if self.config.sft:
            metrics["train/trained_tokens"] = sum(total for total, _ in plan.totals)
        elif mismatch := [r.mismatch for r in reported if r.mismatch is not None]:  # none: --no-rollout-log-probs
            count = sum(m.tokens for m in mismatch)
            metrics.update({"train/logprob_abs_diff_mean": sum(m.abs_sum for m in mismatch) / max(count, 1.0),
                            "train/logprob_abs_diff_max": max(m.abs_max for m in mismatch)})
        if self.config.algorithm.advantage_estimator != "ppo" and not self.config.sft:
            metrics["rollout/advantage_abs_mean"] = float(np.mean([abs(q.advantage) for q in plan.sequences]
                                                                  or [0.0]))
        for key in reported[0].steps[0]:
            if key in _PER_STEP:
                values = [step[key] for step in reported[0].steps]
            else:  # weighted sums over each rank's share of the step
                values = [sum(r.steps[i].get(key, 0.0) for r in reported) for i in range(len(plan.totals))]
            metrics[f"train/{key}"] = float(np.mean(values))
        return metrics

    def eval_loss(self, samples: list[Sample], prefix: str) -> dict[str, float]:
        """SFT: the mean negative log-likelihood per trained token of ``samples`` (``<prefix>/loss``), forward
        only on the trainer ranks, each its data-parallel share."""
        if not self.cluster.has_actors:
            return {}
        shares = split_data_parallel(self.convert(self.args, samples), self.dp_size)
        results = self.cluster.ranks.eval_loss([shares[r] for r in self.dp_rank])
        total, count = sum(r.nll for r in results), sum(r.tokens for r in results)
        return {f"{prefix}/loss": total / max(count, 1.0), f"{prefix}/tokens": count,
                f"{prefix}/skipped": float(sum(s.status not in TRAINABLE for s in samples))}


def staleness(rollout_id: int, samples: list[Sample], bound: int) -> dict[str, float]:
    """How many policy versions each sample's oldest token lags the policy that trains on it (rollout n is
    trained by version n). Rollout n starts only once the engines hold version n - K, and a push during it
    (--partial-rollout) only makes later tokens newer, so none may lag more than --max-staleness K (0 in the
    synchronous loop); one that does is a bug, and stops the run rather than train off-policy unawares."""
    lags = [rollout_id - s.weight_version for s in samples if s.weight_version is not None]
    if lags and max(lags) > bound:
        raise RuntimeError(f"rollout {rollout_id}: a sample was generated {max(lags)} policy versions before "
                           f"the step that trains on it, more than the bound {bound}")
    return {"rollout/staleness_mean": float(np.mean(lags)) if lags else 0.0,
            "rollout/staleness_max": float(max(lags, default=0))}
