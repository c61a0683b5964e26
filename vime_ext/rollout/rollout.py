"""The default rollout function: ``n_samples_per_prompt`` samples per prompt, generated concurrently, rewarded.

A custom one (``--rollout-function-path``) takes the same arguments and returns groups of Samples.
"""

import asyncio
import inspect
from dataclasses import replace

from tqdm import tqdm

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
