"""A two-turn plug-in for --partial-rollout runs: in every rollout but the first, the second turn waits until a
weight push has landed after the first turn (the push of the step that trains while this rollout is generated),
so each trajectory spans two weight versions whatever the machine's speed."""

import asyncio
import time

from vime_ext.agent.trajectory import Trajectory

_CLIENTS = []  # each rollout's client, in order (one per rollout; kept so that ids are not reused)


async def generate(args, sample, sampling_params, evaluation=False):
    client = args.rollout_client
    if client not in _CLIENTS:
        _CLIENTS.append(client)
    messages = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": sample.prompt}]
    chat = Trajectory(args.tokenizer, messages)
    await chat.generate(client, sampling_params)
    if _CLIENTS.index(client) > 0 and chat.versions:
        first, deadline = max(v for v in chat.versions if v is not None), time.monotonic() + 300
        while client.gate.version <= first:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no weight push after version {first} within 300 s")
            await asyncio.sleep(0.05)
    chat.append_messages([{"role": "user", "content": "Go on."}])
    await chat.generate(client, sampling_params)
    return chat.to_sample(sample)
