"""The default rollout function: ``n_samples_per_prompt`` samples per prompt, generated concurrently, rewarded.

A custom one (``--rollout-function-path``) takes the same arguments and returns groups of Samples.
"""

import asyncio
import inspect
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from vime_ext.algorithms.train_data import TRAINABLE, scalar_reward
from vime_ext.rollout.client import RolloutClient
from vime_ext.rollout.config import RolloutConfig
from vime_ext.rollout.plugins import load_function
from vime_ext.rollout.sample import Sample, Status


def sample_seed(base: int, rollout_id: int, index: int) -> int:
    """A distinct, reproducible sampling seed per (rollout, sample): a resumed run samples what the
    uninterrupted one would have (with a deterministic engine)."""
    return (base * 1_000_003 + rollout_id * 10_007 + index) % 2**31


async def generate_rollout(config: RolloutConfig, client: RolloutClient, tokenizer, prompts: list[dict],
                           weight_version: int | None = None, rollout_id: int = 0) -> list[list[Sample]]:
    """``prompts``: dicts with ``prompt`` (text or chat messages), optional ``label`` and ``metadata``.
    With ``--rollout-seed`` every sample gets its own seed (see ``sample_seed``)."""
    generate = load_function(config.custom_generate_function_path, "--custom-generate-function-path")
    reward = load_function(config.custom_rm_path, "--custom-rm-path")
    params = config.sampling_params()
    groups = [[Sample(prompt=p["prompt"], label=p.get("label"), metadata=dict(p.get("metadata") or {}),
                      group_index=g, index=g * config.n_samples_per_prompt + i)
               for i in range(config.n_samples_per_prompt)] for g, p in enumerate(prompts)]
    progress = tqdm(total=sum(map(len, groups)), desc="rollout", unit="sample", leave=False)

    async def one(sample: Sample) -> None:
        own = params if params.seed is None else replace(params, seed=sample_seed(params.seed, rollout_id,
                                                                                   sample.index))
        await generate(client, tokenizer, sample, own, weight_version=weight_version)
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            value = reward(sample)
            sample.reward = await value if inspect.isawaitable(value) else value
        progress.update(1)

    try:
        await asyncio.gather(*(one(s) for group in groups for s in group))
    finally:
        progress.close()
    return groups


def run_rollout(config: RolloutConfig, url: str, tokenizer, prompts: list[dict], **kwargs) -> list[list[Sample]]:
    """Run ``--rollout-function-path`` against the engine or router at ``url`` to completion (a fresh client
    and event loop per call); ``kwargs`` go to the rollout function."""
    rollout = load_function(config.rollout_function_path, "--rollout-function-path")

    async def run():
        client = RolloutClient(url, max_concurrency=256, timeout_s=max(300.0, config.rollout_max_response_len / 5.0))
        try:
            return await rollout(config, client, tokenizer, prompts, **kwargs)
        finally:
            await client.close()

    return asyncio.run(run())


def rollout_metrics(samples: list[Sample], prefix: str) -> dict[str, float]:
    """Reward, length and outcome statistics of a rollout, named ``<prefix>/...``."""
    rewards = np.array([scalar_reward(s) for s in samples], dtype=np.float64)
    lengths = np.array([s.response_length for s in samples], dtype=np.float64)
    return {f"{prefix}/reward_mean": float(rewards.mean()), f"{prefix}/reward_std": float(rewards.std()),
            f"{prefix}/response_length": float(lengths.mean()),
            f"{prefix}/truncated": float(np.mean([s.status == Status.TRUNCATED for s in samples])),
            f"{prefix}/failed": float(np.mean([s.status not in TRAINABLE for s in samples])),
            f"{prefix}/weight_version": float(min(s.weight_version or 0 for s in samples))}
