"""Greedy replies of a fixed model (the run's reward model, whose weights never change), each distinct prompt
asked once per process.

vLLM's batched kernels are not batch-invariant: in bf16 the same greedy prompt can get another reply when it is
batched with other requests. A reward that scores a question before and after the policy's work then counts that
noise as the policy's doing: on an H200, MemUpdate's fixed Qwen2.5-Coder-1.5B reader changed its score on 2 of
64 held-out episodes whose store no edit had touched (mean F1 0.5904 before, 0.5878 after). Asked once, a prompt
has one reply for the rest of the process, so an unchanged prompt scores the same before and after whichever
batch it lands in, and the repeats cost nothing (a GRPO group's samples share their "before" prompts).

Only greedy requests (temperature 0) are kept; sampled ones go to the engine every time. Concurrent requests for
one prompt share one request. A request that fails is not kept, so the next one asks again. Replies are kept per
engine URL (an engine restarted at its address serves the same weights) up to ``max_entries``, oldest dropped
first. Two processes do not share replies: rows evaluated in separate runs can still differ by this noise in
their "before" scores, never in a delta within one run.
"""

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from vime_ext.engines.client import RolloutClient
from vime_ext.engines.protocol import GenerateResult, SamplingParams


class FixedModelReplies:
    def __init__(self, max_entries: int = 100_000):
        self.max_entries = max_entries
        self._replies: OrderedDict[tuple, GenerateResult] = OrderedDict()
        self._in_flight: dict[tuple, tuple[asyncio.AbstractEventLoop, asyncio.Task]] = {}
        self.asked = 0  # requests sent to an engine
        self.reused = 0  # requests answered from a kept or in-flight reply

    async def generate(self, url: str, token_ids: list[int], params: SamplingParams) -> GenerateResult:
        if params.temperature != 0.0:
            self.asked += 1
            return await _ask(url, token_ids, params)
        key = (url.rstrip("/"), hashlib.sha256(np.asarray(token_ids, dtype=np.int64).tobytes()).hexdigest(), params)
        if key in self._replies:
            self._replies.move_to_end(key)
            self.reused += 1
            return _copy(self._replies[key])
        loop = asyncio.get_running_loop()
        entry = self._in_flight.get(key)
        if entry is not None and entry[0] is loop:  # a task belongs to the loop that made it
            self.reused += 1
            task = entry[1]
        else:
            self.asked += 1
            task = loop.create_task(_ask(url, list(token_ids), params))
            self._in_flight[key] = (loop, task)
            task.add_done_callback(lambda done: self._settle(key, done))
        # shielded: a caller that is cancelled leaves the request running for the others that wait on it
        return _copy(await asyncio.shield(task))

    def _settle(self, key: tuple, task: asyncio.Task) -> None:
        if self._in_flight.get(key, (None, None))[1] is task:
            del self._in_flight[key]
        if task.cancelled() or task.exception() is not None:  # reading the exception marks it retrieved
            return
        self._replies[key] = task.result()
        self._replies.move_to_end(key)
        while len(self._replies) > self.max_entries:
            self._replies.popitem(last=False)

    def __len__(self) -> int:
        return len(self._replies)


async def _ask(url: str, token_ids: list[int], params: SamplingParams) -> GenerateResult:
    client = RolloutClient(url)
    try:
        return await client.generate(token_ids, params)
    finally:
        await client.close()


def _copy(result: GenerateResult) -> GenerateResult:
    return replace(result, token_ids=list(result.token_ids), log_probs=list(result.log_probs),
                   extra=dict(result.extra), versions=list(result.versions))


# The process's replies: reward functions of one rollout process share them.
FIXED_REPLIES = FixedModelReplies()
