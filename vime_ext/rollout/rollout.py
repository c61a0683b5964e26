"""The default rollout function and the machinery around every rollout function.

``generate_rollout(args, rollout_id, data_source, evaluation=False)`` (slime's signature) takes groups from the
data source, runs ``--custom-generate-function-path`` on every sample concurrently, folds a multi-sequence
answer into one trajectory, rewards it (``--custom-rm-path``, per sample or per group with ``--group-rm``),
and with ``--dynamic-sampling-filter-path`` keeps drawing ``--over-sampling-batch-size`` prompts at a time until
``--rollout-batch-size`` groups pass the filter. ``run_rollout`` runs any rollout function against a router and
checks what it returns (``validate.check_groups``) before anything trains on it.
"""

import asyncio
import copy
import inspect
import time
from dataclasses import dataclass, field, replace

import numpy as np
from tqdm import tqdm

from vime_ext.agent.rewards import overlong_penalty
from vime_ext.agent.sample import TRAINABLE, Sample, Status
from vime_ext.algorithms.train_data import scalar_reward
from vime_ext.engines.client import RolloutClient
from vime_ext.engines.generation_gate import GenerationGate
from vime_ext.rollout.config import sampling_params
from vime_ext.rollout.data_source import DataSource
from vime_ext.rollout.failures import FailurePolicy, check_failed_fraction, drop_group, needs_retry, plugin_failure
from vime_ext.rollout.plugins import PluginArgs, call_plugin, load_function
from vime_ext.rollout.validate import RolloutError, check_groups, check_number, check_sample, fold_trajectory, where


@dataclass
class RolloutOutput:
    """What a rollout function may return instead of bare groups: the groups plus rollout-level metrics
    (logged as ``rollout/<name>``)."""

    groups: list[list[Sample]]
    metrics: dict[str, float] = field(default_factory=dict)


def sample_seed(base: int, rollout_id: int, index: int) -> int:
    """A distinct, reproducible sampling seed per (rollout, sample): a resumed run samples what the
    uninterrupted one would have (with a deterministic engine)."""
    return (base * 1_000_003 + rollout_id * 10_007 + index) % 2**31


def penalize_overlong(args, sample: Sample) -> None:
    """``--overlong-buffer-len``: DAPO's length penalty on the sample's reward (its response, the last generate
    call's), logged per sample as ``overlong_penalty``."""
    if args.overlong_buffer_len is None or sample.reward is None:
        return
    penalty = overlong_penalty(sample.response_length, args.rollout_max_response_len, args.overlong_buffer_len,
                               args.overlong_penalty_factor)
    sample.reward += penalty  # a number once apply_reward has run
    sample.metrics["overlong_penalty"] = penalty


def oldest_version(sample: Sample, at_start: int | None) -> int | None:
    """The oldest weight version among the sample's tokens (every training sequence's) where they were
    recorded, else the version the engines held when the rollout started (which sampled every token when
    no weight update can land mid-rollout)."""
    recorded = [v for seq in (sample, *sample.turns) for v in seq.token_versions if v is not None]
    return min(recorded) if recorded else at_start


def apply_reward(sample: Sample, value) -> None:
    """A reward function's answer onto the sample: a number, or a dict whose "reward" entry is the reward and
    whose other entries are metrics."""
    if isinstance(value, dict):
        if "reward" not in value:
            raise RolloutError(f"{where(sample)}: the reward function returned a dict without a 'reward' entry: "
                               f"{sorted(value)}")
        metrics = {k: v for k, v in value.items() if k != "reward"}
        for name, metric in metrics.items():
            check_number(metric, f"{where(sample)}: reward entry {name!r}")
        sample.metrics.update(metrics)
        value = value["reward"]
    sample.reward = check_number(value, f"{where(sample)}: the reward") if value is not None else None


async def generate_rollout(args: PluginArgs, rollout_id: int, data_source: DataSource,
                           evaluation: bool = False) -> RolloutOutput:
    generate = load_function(args.custom_generate_function_path, "--custom-generate-function-path")
    reward = load_function(args.custom_rm_path, "--custom-rm-path")
    keep = None
    if args.dynamic_sampling_filter_path and not evaluation:
        keep = load_function(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path")
    params = sampling_params(args, evaluation)
    failures = FailurePolicy.from_args(args)
    counts = {"samples_regenerated": 0, "groups_dropped": 0}
    target = len(data_source) if evaluation else args.rollout_batch_size
    progress = tqdm(total=target * data_source.group_size, desc="eval" if evaluation else "rollout",
                    unit="sample", leave=False)
    # When each sample finished, from the rollout's start: the first and the last say how long the tail is
    started, finished = time.perf_counter(), []

    async def attempt(sample: Sample) -> Sample:
        own = params if params.seed is None else replace(params, seed=sample_seed(params.seed, rollout_id,
                                                                                   sample.index))
        done = fold_trajectory(sample, await call_plugin(generate, args, sample, own, evaluation=evaluation))
        done.weight_version = oldest_version(done, args.weight_version)
        if done.status in TRAINABLE and not args.group_rm:
            apply_reward(done, await call_plugin(reward, args, done))
            penalize_overlong(args, done)
            check_sample(done)
        return done

    async def one(slot: Sample) -> Sample:
        """generate and reward one copy of ``slot`` (kept as drawn for a second attempt); a plug-in's exception,
        timeout or malformed answer fails this sample, not the rollout."""
        sample = copy.deepcopy(slot)
        try:
            return await asyncio.wait_for(attempt(sample), failures.timeout_s)
        except Exception as err:  # noqa: BLE001 (any plug-in error; cancellation still propagates)
            return plugin_failure(sample, err, failures.timeout_s)
        finally:
            progress.update(1)
            finished.append(time.perf_counter() - started)

    def metrics() -> dict[str, float]:
        return {**{k: float(v) for k, v in counts.items()}, "first_sample_s": min(finished, default=0.0),
                "last_sample_s": max(finished, default=0.0)}

    async def group_reward(group: list[Sample]) -> None:
        try:
            values = await asyncio.wait_for(call_plugin(reward, args, group), failures.timeout_s)
            if not isinstance(values, (list, tuple)) or len(values) != len(group):
                raise RolloutError(f"--group-rm: the reward function must return one reward per sample of group "
                                   f"{group[0].group_index} ({len(group)}), got {values!r:.200}")
            for sample, value in zip(group, values):
                if sample.status in TRAINABLE:
                    apply_reward(sample, value)
                    penalize_overlong(args, sample)
                    check_sample(sample)
        except Exception as err:  # noqa: BLE001 (the group reward's failure fails every sample it scored)
            for sample in group:
                if sample.status in TRAINABLE:
                    plugin_failure(sample, err, failures.timeout_s)

    async def one_group(slots: list[Sample]) -> list[Sample]:
        group = list(await asyncio.gather(*(one(s) for s in slots)))
        retry = needs_retry(group) if failures.policy == "regenerate" else []
        if retry:  # once; the group's reward (--group-rm) waits for the second attempt
            counts["samples_regenerated"] += len(retry)
            progress.total += len(retry)
            for i, again in zip(retry, await asyncio.gather(*(one(slots[i]) for i in retry))):
                group[i] = again
        if args.group_rm:
            await group_reward(group)
        if needs_retry(group) and not evaluation:
            drop_group(group)
            counts["groups_dropped"] += 1
        return group

    try:
        if keep is None:
            groups = list(await asyncio.gather(*(one_group(g) for g in data_source.get_samples(target))))
            check_failed_fraction([s for g in groups for s in g], failures.max_failed_fraction)
            return RolloutOutput(groups, metrics())
        groups, drawn = [], 0
        while len(groups) < target:
            if drawn >= len(data_source) + target * 10:
                raise RolloutError(f"--dynamic-sampling-filter-path {args.dynamic_sampling_filter_path} kept "
                                   f"{len(groups)} of {drawn} groups, fewer than --rollout-batch-size {target} "
                                   f"after more than a pass over the {len(data_source)} prompts")
            batch = data_source.get_samples(args.over_sampling_batch_size or target)
            drawn += len(batch)
            done = await asyncio.gather(*(one_group(g) for g in batch))
            check_failed_fraction([s for g in done for s in g], failures.max_failed_fraction)
            for group in done:
                if len(groups) < target and await call_plugin(keep, args, group):
                    groups.append(group)
        for g, group in enumerate(groups):  # numbered as the trainer expects: by position
            for i, sample in enumerate(group):
                sample.group_index, sample.index = g, g * len(group) + i
        return RolloutOutput(groups, {"dynamic_sampling_kept": target / drawn, "dynamic_sampling_drawn": drawn,
                                      **metrics()})
    finally:
        progress.close()


def run_rollout(args: PluginArgs, url: str | None, rollout_id: int, data_source: DataSource,
                evaluation: bool = False, gate: GenerationGate | None = None) -> RolloutOutput:
    """Run ``--rollout-function-path`` against the engine or router at ``url`` to completion (a fresh client and
    event loop per call, reachable as ``args.rollout_client`` and ``args.loop``; no client without ``url``, as in
    SFT) and check its groups."""
    rollout = load_function(args.rollout_function_path, "--rollout-function-path")

    done = {}

    async def run() -> None:
        client = RolloutClient(url, max_concurrency=256, timeout_s=max(300.0, args.rollout_max_response_len / 5.0),
                               gate=gate, stream=args.rollout_stream_interval > 0) if url else None
        args.rollout_client, args.loop = client, asyncio.get_running_loop()
        try:
            if inspect.iscoroutinefunction(rollout):
                done["output"] = await rollout(args, rollout_id, data_source, evaluation=evaluation)
            else:
                # A plain function runs on a worker thread; it reaches the client through
                # asyncio.run_coroutine_threadsafe(coro, args.loop).
                done["output"] = await asyncio.to_thread(rollout, args, rollout_id, data_source,
                                                         evaluation=evaluation)
        finally:
            args.rollout_client = args.loop = None
            if client:
                await client.close()

    # The output is handed back beside the task, not as its result: on the main thread asyncio.run writes out the
    # finished task's repr, result included, twice while it restores the SIGINT handler (signal.getsignal turns
    # the handler into an enum and formats the error it catches). For W1's 256 samples that was 0.5 s a rollout.
    asyncio.run(run())
    output = done["output"]
    if not isinstance(output, RolloutOutput):
        output = RolloutOutput(output)
    check_groups(output.groups, None if evaluation else args.rollout_batch_size, data_source.group_size)
    return output


def rollout_metrics(samples: list[Sample], prefix: str) -> dict[str, float]:
    """Reward, length and outcome statistics of a rollout, named ``<prefix>/...``; plug-in metrics
    (``Sample.metrics``) averaged over the samples that report them."""
    rewards = np.array([scalar_reward(s) for s in samples], dtype=np.float64)
    lengths = np.array([s.response_length for s in samples], dtype=np.float64)
    metrics = {f"{prefix}/reward_mean": float(rewards.mean()), f"{prefix}/reward_std": float(rewards.std()),
               f"{prefix}/response_length": float(lengths.mean()),
               f"{prefix}/truncated": float(np.mean([s.status == Status.TRUNCATED for s in samples])),
               f"{prefix}/failed": float(np.mean([s.status not in TRAINABLE for s in samples])),
               f"{prefix}/weight_version": float(min(s.weight_version or 0 for s in samples)),
               f"{prefix}/sequences_per_sample": float(np.mean([(s.response_length > 0) + len(s.turns)
                                                                for s in samples]))}
    groups: dict[int, list[float]] = {}
    for sample, value in zip(samples, rewards):
        groups.setdefault(sample.group_index, []).append(value)
    if len(groups) < len(samples):  # groups of several samples: GRPO learns only from groups whose rewards differ
        metrics[f"{prefix}/uniform_reward_groups"] = float(np.mean([np.ptp(g) == 0 for g in groups.values()]))
    names = sorted({name for s in samples for name in s.metrics})
    for name in names:
        metrics[f"{prefix}/{name}"] = float(np.mean([s.metrics[name] for s in samples if name in s.metrics]))
    return metrics
