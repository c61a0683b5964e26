"""Async HTTP client for the token-in/token-out generate route of one or more engines (or a router).

It speaks HTTP through aiohttp, not httpx (which the rest of vime_ext uses for its few control calls): a rollout
holds hundreds of requests open at once, and httpx's connection pool scans every connection whenever one is
taken or given back, so its cost grows with the square of the requests in flight. On W1's 256 concurrent
1,024-token answers that scan was 3 s of the client's 5 s of CPU per rollout on a CPU core
(``tools/bench_rollout_client.py`` measures it). Replies are parsed with orjson: with log-probs, one 1,024-token
reply is about 150 KB of JSON.

``stream=True`` asks for each reply in pieces as the engine generates them (``--rollout-stream-interval``): the
engine's API server then builds each answer a piece at a time while the GPU decodes, instead of building hundreds
of whole answers one after another once they all finish together.
"""

import asyncio
import itertools
import uuid
from dataclasses import replace

import aiohttp
import orjson

from vime_ext.engines.generation_gate import GenerationGate
from vime_ext.engines.protocol import (
    GENERATE_ROUTE,
    GenerateResult,
    InvalidRequest,
    SamplingParams,
    StreamedReply,
    StreamFailed,
    generate_request,
    parse_generate_response,
)


class EngineUnavailable(RuntimeError):
    """No engine answered a request after every retry."""


class RolloutClient:
    """Sends generate requests with bounded concurrency, a per-request timeout, and retries.

    Connection errors, timeouts and 5xx answers are retried with exponential backoff, each retry on the next
    base URL (with several engines listed, a dead one is skipped; with one router URL the router re-routes).
    A 4xx answer is the request's fault and raises ``InvalidRequest`` at once. The same ``request_id`` is sent
    on every try, so an engine can tell a retry from a new request.
    """

    def __init__(self, base_urls: str | list[str], max_concurrency: int = 64, timeout_s: float = 300.0,
                 max_retries: int = 4, backoff_s: float = 0.5, gate: GenerationGate | None = None,
                 stream: bool = False):
        """``gate``: weights may be pushed mid-request (``--partial-rollout``, see ``generation_gate``); a reply the
        push interrupts is continued after it, and each token's version is recorded. ``stream``: replies come in
        pieces as they are generated (a piece that reports an error, or a stream cut short, is retried)."""
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("RolloutClient needs at least one engine or router URL")
        self.base_urls = [u.rstrip("/") for u in urls]
        self._next_url = itertools.cycle(range(len(self.base_urls)))
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self.max_concurrency = max_concurrency
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=10.0)
        self._session: aiohttp.ClientSession | None = None  # made on first use, inside the loop that uses it
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.retries = 0  # how many tries failed over (read by tests and logs)
        self.gate = gate
        self.stream = stream

    async def generate(self, token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                       session_id: str | None = None) -> GenerateResult:
        """``session_id`` (sent as X-Session-ID) lets a consistent-hash router keep a conversation on one engine.
        With a gate, a reply that a weight push aborts is asked for again, prompt plus the tokens so far, until
        it stops or reaches ``max_new_tokens``; the result is the segments end to end."""
        request_id = request_id or uuid.uuid4().hex
        if self.gate is None:
            return await self._generate_once(token_ids, params, request_id, session_id)
        tokens, log_probs, versions, segment = [], [], [], 0
        first_prompt_log_probs: list[float] = []
        while True:
            version = await self.gate.wait_open()
            rest = replace(params, max_new_tokens=params.max_new_tokens - len(tokens))
            result = await self._generate_once(list(token_ids) + tokens, rest, f"{request_id}-{segment}", session_id)
            if not segment:  # a later segment's prompt holds the reply so far
                first_prompt_log_probs = result.prompt_log_probs
            tokens += result.token_ids
            log_probs += result.log_probs
            versions += [version] * len(result.token_ids)
            if result.finish_reason != "abort":
                break
            if len(tokens) >= params.max_new_tokens:
                result.finish_reason = "length"
                break
            self.gate.interruptions += 1
            segment += 1
        return GenerateResult(tokens, log_probs, result.finish_reason, prompt_length=len(token_ids),
                              extra=result.extra, versions=versions, prompt_log_probs=first_prompt_log_probs)

    async def _generate_once(self, token_ids: list[int], params: SamplingParams, request_id: str,
                             session_id: str | None) -> GenerateResult:
        # The prompt's log-probs come with a whole reply only (a streamed one would carry them in its first piece)
        stream = self.stream and not params.prompt_log_probs
        body = generate_request(token_ids, params, request_id, stream=stream)
        headers = {"X-Session-ID": session_id} if session_id else None
        start = next(self._next_url)
        errors = []
        async with self._semaphore:
            for attempt in range(self.max_retries + 1):
                url = self.base_urls[(start + attempt) % len(self.base_urls)]
                try:
                    async with self.session().post(url + GENERATE_ROUTE, json=body, headers=headers) as response:
                        status = response.status
                        if status < 400 and stream:
                            reply = StreamedReply(params.log_probs)
                            async for data in response.content.iter_any():
                                if reply.feed(data):
                                    break
                            answer = reply.result()
                        else:
                            answer = await (response.json(loads=orjson.loads, content_type=None) if status < 400
                                            else response.text())
                except (aiohttp.ClientError, asyncio.TimeoutError, StreamFailed) as err:
                    errors.append(f"{url}: {type(err).__name__}: {err}")
                else:
                    if status < 400:
                        result = answer if stream else parse_generate_response(
                            answer, params.log_probs, list(token_ids) if params.prompt_log_probs else None)
                        result.prompt_length = len(token_ids)  # vLLM's whole replies leave the prompt out
                        return result
                    if status < 500:
                        raise InvalidRequest(f"{url} refused request {request_id}: HTTP {status} {answer[:500]}")
                    errors.append(f"{url}: HTTP {status} {answer[:200]}")
                self.retries += 1
                if attempt < self.max_retries:
                    await asyncio.sleep(self.backoff_s * 2**attempt)
        raise EngineUnavailable(f"request {request_id} failed on every try: " + " | ".join(errors))

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout,
                                                  connector=aiohttp.TCPConnector(limit=self.max_concurrency))
        return self._session

    async def health(self) -> dict[str, bool]:
        async def one(url):
            try:
                async with self.session().get(url + "/health", timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                    return url, r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return url, False

        return dict(await asyncio.gather(*(one(u) for u in self.base_urls)))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
