"""A weight update landing mid-reply (--partial-rollout), staged against a real engine: replies are sent with a
gated client, the gate closes and the engine pauses with in-flight requests aborted, then both resume under
version 1. The checks: the reply is its segments end to end, each continuation's prompt carries the tokens
before it, and the versions say which segment sampled each token."""

import asyncio
import time

import httpx

from vime_ext.engines.client import RolloutClient
from vime_ext.engines.generation_gate import GenerationGate
from vime_ext.engines.protocol import GenerateResult, SamplingParams


async def pause_mid_generation(url: str, prompts: list[list[int]], params: SamplingParams, delay_s: float,
                               stream: bool = False):
    """The replies to ``prompts``, paused ``delay_s`` after they were sent; returns (results, the segments each
    request was made of as (sent tokens, engine result) by request, how many replies the pause interrupted).
    ``stream``: the replies come in pieces (``--rollout-stream-interval``)."""
    gate, segments = GenerationGate(version=0), {}
    client = RolloutClient(url, gate=gate, stream=stream)
    once = client._generate_once

    async def recorded(token_ids, p, request_id, session_id):
        result = await once(token_ids, p, request_id, session_id)
        segments.setdefault(request_id.rsplit("-", 1)[0], []).append((list(token_ids), result))
        return result

    client._generate_once = recorded
    try:
        tasks = [asyncio.create_task(client.generate(p, params, request_id=f"r{i}")) for i, p in enumerate(prompts)]
        await asyncio.sleep(delay_s)
        gate.close()
        async with httpx.AsyncClient(timeout=30) as control:  # as the driver's control calls go
            (await control.post(url + "/pause", params={"mode": "abort"})).raise_for_status()
            gate.open(1)
            (await control.post(url + "/resume")).raise_for_status()
        return await asyncio.gather(*tasks), segments, gate.interruptions
    finally:
        await client.close()


def interrupted_replies(url: str, prompts: list[list[int]], params: SamplingParams,
                        fractions: tuple[float, ...] = (0.3, 0.5, 0.15, 0.7, 0.05, 0.4, 0.6, 0.2, 0.8, 0.1),
                        stream: bool = False):
    """``pause_mid_generation`` until a pause lands while replies are being generated: before each try the
    replies are timed without a pause (the machine's load changes), then paused at the next of these fractions
    of that time, whatever the machine's speed."""

    async def timed() -> float:
        client = RolloutClient(url, stream=stream)
        try:
            start = time.perf_counter()
            await asyncio.gather(*(client.generate(p, params) for p in prompts))
            return time.perf_counter() - start
        finally:
            await client.close()

    tried = []
    for fraction in fractions:
        seconds = asyncio.run(timed())
        results, segments, interruptions = asyncio.run(pause_mid_generation(url, prompts, params, fraction * seconds,
                                                                                  stream))
        if interruptions:
            return results, segments
        tried.append(f"{fraction * seconds:.3f} of {seconds:.3f} s")
    raise AssertionError(f"no pause landed mid-generation; paused after: {', '.join(tried)}")


def check_stitched(prompt: list[int], result: GenerateResult, parts: list, max_new_tokens: int) -> bool:
    """Assert the reply is its segments end to end with the right versions; whether it spans both versions."""
    assert len(result.token_ids) == max_new_tokens and result.finish_reason == "length"
    assert result.token_ids == [t for _, seg in parts for t in seg.token_ids]
    assert result.log_probs == [lp for _, seg in parts for lp in seg.log_probs]
    for k, (sent, _) in enumerate(parts):  # each continuation: the prompt and every token before it
        assert sent == prompt + [t for _, seg in parts[:k] for t in seg.token_ids]
    assert all(seg.finish_reason == "abort" for _, seg in parts[:-1])
    if len(parts) == 1:  # sent before the pause and finished, or sent after it
        assert len(set(result.versions)) == 1
        return False
    before = sum(len(seg.token_ids) for _, seg in parts[:-1])
    assert result.versions == [0] * before + [1] * (len(result.token_ids) - before)
    return 0 < before < len(result.token_ids)
