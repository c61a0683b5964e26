"""The rollout path's own cost, with the engine's taken out: a stand-in engine answers a workload's requests the
moment the last of them arrives, so what a rollout takes is what vime_ext spends around the engine (the client,
the router, the plug-ins, building samples).

    python tools/bench_rollout_client.py --workload w1 [--rounds 3]

The stand-in runs in a process of its own and speaks vLLM's token-in/token-out route: every reply carries exactly
``response_tokens`` token ids and, when the request asks for them, one log-prob entry per token as vLLM writes it.
Its replies are built before the rounds start, so it spends next to nothing while they run. Each round is a whole
rollout through ``run_rollout`` with ``tools/bench_plugins.py`` (the peers bench's plug-ins) and the workload's
prompts, straight to the stand-in and through vllm-router, with the engine's log-probs asked for and not
(``--no-rollout-log-probs``), the replies streamed in pieces of ``--stream-interval`` tokens (the training default,
64) and whole (0). Reported per round: wall seconds, when the first and the last sample finished, and the CPU
seconds this process spent (the rollout manager's share of a real run).
"""

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.bench_peers import WORKLOADS, Workload  # noqa: E402

# Distinct canned replies: requests are spread over them by id, so replies differ without being built per request
REPLIES = 16


@dataclass(frozen=True)
class CannedReply:
    """One reply of ``response_tokens`` tokens as vLLM's generate route sends it, whole (request id and prompt
    ids spliced in per request: ``body % (id, prompt)``) and streamed (the request id spliced into every piece:
    ``b"".join(pieces) % {b"id": id}``), each without and with log-probs (index 0 and 1)."""
    body: tuple[bytes, bytes]
    pieces: tuple[bytes, bytes]


def canned_replies(response_tokens: int, vocab: int, stream_interval: int, seed: int = 0) -> list[CannedReply]:
    from vime_ext.engines.protocol import choice_pieces

    rng = random.Random(seed)
    replies = []
    for _ in range(REPLIES):
        ids = [rng.randrange(1000, vocab) for _ in range(response_tokens)]
        content = [{"token_id": t, "logprob": -5 * rng.random(), "token": f"token_id:{t}", "bytes": None,
                    "top_logprobs": []} for t in ids]
        bodies, pieces = [], []
        for logprobs in (None, {"content": content}):
            choice = {"index": 0, "finish_reason": "length", "token_ids": ids, "logprobs": logprobs}
            body = {"request_id": "{REQUEST}", "output_mode": "tokens", "prompt_token_ids": "{PROMPT}",
                    "choices": [choice]}
            bodies.append(json.dumps(body).replace('"{REQUEST}"', '"%s"').replace('"{PROMPT}"', "%s").encode())
            # the same choice in pieces: streamed and whole replies carry the same log-prob entries
            pieces.append(b"".join(choice_pieces("{REQUEST}", choice, stream_interval or None))
                          .replace(b"{REQUEST}", b"%(id)s"))
        replies.append(CannedReply(tuple(bodies), tuple(pieces)))
    return replies


def serve_stand_in(port: int, round_size: int, response_tokens: int, vocab: int, stream_interval: int) -> None:
    """The stand-in engine: holds requests until ``round_size`` have arrived, then answers them all, whole or (a
    request with ``"stream": true``) in pieces of ``stream_interval`` tokens, sent at once."""
    import asyncio

    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    replies = canned_replies(response_tokens, vocab, stream_interval)
    app, state = FastAPI(), {"arrived": 0, "round": None}

    @app.post("/inference/v1/generate")
    async def generate(request: Request):
        body = await request.json()
        if state["round"] is None:
            state["round"] = asyncio.Event()
        event = state["round"]
        state["arrived"] += 1
        if state["arrived"] % round_size == 0:
            event.set()
            state["round"] = None
        await event.wait()
        reply = replies[hash(body["request_id"]) % REPLIES]
        log_probs = int(body["sampling_params"].get("logprobs") is not None)
        if body.get("stream"):
            return Response(reply.pieces[log_probs] % {b"id": body["request_id"].encode()},
                            media_type="text/event-stream")
        return Response(reply.body[log_probs] % (body["request_id"].encode(), json.dumps(body["token_ids"]).encode()),
                        media_type="application/json")

    @app.get("/health")
    async def health():
        return {}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


@dataclass
class Round:
    path: str  # "engine" (straight to the stand-in) or "router"
    log_probs: bool
    streamed: bool
    round: int
    wall_s: float
    first_sample_s: float
    last_sample_s: float
    client_cpu_s: float


def rollout_round(url: str, workload: Workload, tokenizer, log_probs: bool, stream_interval: int,
                  rollout_id: int) -> tuple:
    from vime_ext.data.prompt_dataset import PromptRecord
    from vime_ext.rollout.config import RolloutConfig
    from vime_ext.rollout.data_source import DataSource
    from vime_ext.rollout.plugins import plugin_args
    from vime_ext.rollout.rollout import run_rollout

    config = RolloutConfig(rollout_batch_size=workload.prompts, n_samples_per_prompt=workload.samples,
                           rollout_max_response_len=workload.response_tokens, rollout_log_probs=log_probs,
                           rollout_stream_interval=stream_interval,
                           custom_generate_function_path="tools.bench_plugins.generate",
                           custom_rm_path="tools.bench_plugins.reward")
    args = plugin_args([config])
    args.tokenizer, args.weight_version = tokenizer, 0
    records = [PromptRecord(f"Prompt {i}:" + " river" * (workload.prompt_tokens - 3), "", {}, f"p{i}")
               for i in range(workload.prompts)]
    cpu, start = time.process_time(), time.perf_counter()
    output = run_rollout(args, url, rollout_id, DataSource(records, workload.samples))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    lengths = {s.response_length for g in output.groups for s in g}
    if lengths != {workload.response_tokens}:
        raise RuntimeError(f"responses of {sorted(lengths)} tokens, not {workload.response_tokens}")
    return wall, output.metrics["first_sample_s"], output.metrics["last_sample_s"], cpu


def table(rounds: list[Round]) -> str:
    lines = ["| path | log-probs | replies | round | wall s | first sample s | last sample s | client CPU s |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.path} | {'yes' if r.log_probs else 'no'} | {'streamed' if r.streamed else 'whole'} | {r.round} "
              f"| {r.wall_s:.2f} | {r.first_sample_s:.2f} | {r.last_sample_s:.2f} | {r.client_cpu_s:.2f} |"
              for r in rounds]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="w1")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per path and log-prob setting")
    parser.add_argument("--stream-interval", type=int, default=64,
                        help="tokens a piece of a streamed reply (--rollout-stream-interval); 0: whole replies only")
    parser.add_argument("--out", type=Path, help="write the rounds here as JSON")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the stand-in's own process: its port
    args = parser.parse_args(argv)
    workload = WORKLOADS[args.workload]
    round_size = workload.prompts * workload.samples

    from transformers import AutoTokenizer

    from vime_ext.models.packaged import qwen_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    if args.serve:
        serve_stand_in(args.serve, round_size, workload.response_tokens, len(tokenizer), args.stream_interval)
        return 0

    from vime_ext.engines.servers import launch_router, start_server, wait_until_serving
    from vime_ext.net import free_port

    port = free_port()
    log_dir = str(args.out.parent) if args.out else None
    command = [sys.executable, __file__, "--workload", args.workload, "--serve", str(port),
               "--stream-interval", str(args.stream_interval)]
    stand_in = start_server("stand_in_engine", command, "127.0.0.1", port, {}, log_dir)
    router, rounds = None, []
    try:
        wait_until_serving([stand_in], timeout_s=120)
        router = launch_router([stand_in.url], log_dir=log_dir)
        wait_until_serving([router], timeout_s=60)
        for path, url in (("engine", stand_in.url), ("router", router.url)):
            for log_probs in (True, False):
                for interval in sorted({args.stream_interval, 0}, reverse=True):
                    for k in range(args.rounds):
                        timings = rollout_round(url, workload, tokenizer, log_probs, interval, k)
                        rounds.append(Round(path, log_probs, interval > 0, k, *timings))
                        print(table(rounds[-1:]).splitlines()[-1], flush=True)
    finally:
        for server in (router, stand_in):
            if server is not None:
                server.stop()
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    print(table(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
