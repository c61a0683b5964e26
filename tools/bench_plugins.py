"""The plug-ins of tools/bench_peers.py's workloads: every response exactly ``--rollout-max-response-len`` tokens
(the engine ignores end-of-sequence), and a reward that costs nothing but varies, so that GRPO's groups have
non-zero advantages and every step trains."""

import hashlib
from dataclasses import replace

from vime_ext.agent.generate import generate as single_turn


async def generate(args, sample, sampling_params, evaluation=False):
    return await single_turn(args, sample, replace(sampling_params, ignore_eos=True), evaluation)


def text_reward(text: str) -> float:
    """A number in [0, 1) from a response's text: the same text, the same reward (every framework's runner)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 2**32


def reward(args, sample) -> float:
    return text_reward(sample.response)
