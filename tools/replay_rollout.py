"""A training rollout's generation on an engine alone: the standalone limit the loop's rollout phase is held to.

    python tools/replay_rollout.py --rollout-data RUN/rollouts --rollout-id 1 --hf-checkpoint DIR \
        [--engine-backend vllm] [--vllm-gpu-memory-utilization 0.7 ...] [--out replay.json]

The loop saves its rollouts with ``--save-debug-rollout-data RUN/rollouts``. This replays one: every trajectory
sends its sequences in the order the rollout made them (a multi-turn sample's ``turns``, then its final
sequence), each with the same prompt tokens and generating exactly the number of tokens the loop's engine
generated (``ignore_eos``), all trajectories at once (the rollout's own client allows 256 requests in flight).
The engine is started here with the same flags the loop gave it, and started alone: nothing else on its device;
the replies come as the loop's did, in pieces of ``--rollout-stream-interval`` tokens (the loop's default, 64) or
whole (0).
Prints and writes seconds, sequences and tokens per second.
"""

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vime_ext.agent.sample import Sample  # noqa: E402
from vime_ext.engines.client import RolloutClient  # noqa: E402
from vime_ext.engines.protocol import SamplingParams  # noqa: E402
from vime_ext.engines.servers import (EngineConfig, launch_engine, split_vllm_args,  # noqa: E402
                                      stream_interval_args, wait_until_serving)
from vime_ext.rollout.config import RolloutConfig  # noqa: E402
from vime_ext.rollout.debug_data import load_rollout  # noqa: E402

LOOP_CONCURRENCY = 256  # vime_ext/rollout/rollout.py's client


def trajectory_requests(sample: Sample) -> list[tuple[list[int], int]]:
    """(prompt tokens, generated tokens) of each sequence of ``sample``, in the order the rollout made them."""
    sequences = [(turn.tokens, len(turn.loss_mask)) for turn in sample.turns]
    sequences.append((sample.tokens, sample.response_length))
    return [(tokens[:len(tokens) - generated], generated) for tokens, generated in sequences if generated > 0]


async def replay(url: str, samples: list[Sample], temperature: float, stream: bool) -> dict[str, float]:
    client = RolloutClient(url, max_concurrency=LOOP_CONCURRENCY, timeout_s=3600, stream=stream)
    counts = {"sequences": 0, "prompt_tokens": 0, "generated_tokens": 0}

    async def one(sample: Sample) -> None:
        for prompt, generated in trajectory_requests(sample):
            params = SamplingParams(temperature=temperature, max_new_tokens=generated, ignore_eos=True)
            result = await client.generate(prompt, params, session_id=f"replay-{sample.index}")
            counts["sequences"] += 1
            counts["prompt_tokens"] += len(prompt)
            counts["generated_tokens"] += len(result.token_ids)

    start = time.perf_counter()
    try:
        await asyncio.gather(*(one(s) for s in samples))
    finally:
        await client.close()
    seconds = time.perf_counter() - start
    return {**counts, "seconds": seconds, "generated_tokens_per_s": counts["generated_tokens"] / seconds}


def main(argv: list[str] | None = None) -> dict:
    own, vllm_args = split_vllm_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollout-data", required=True, help="the loop's --save-debug-rollout-data")
    parser.add_argument("--rollout-id", type=int, default=1, help="which rollout (the first is often warm-up)")
    parser.add_argument("--hf-checkpoint", required=True, help="the model the loop's engine served")
    parser.add_argument("--engine-backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--engine-dtype", default="auto")
    parser.add_argument("--engine-max-model-len", type=int)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rollout-stream-interval", type=int, default=RolloutConfig.rollout_stream_interval,
                        help="as the loop's: replies in pieces of this many tokens; 0: whole replies")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(own)
    groups, _ = load_rollout(args.rollout_data, args.rollout_id)
    samples = [s for g in groups for s in g]
    interval = args.rollout_stream_interval
    extra = vllm_args + stream_interval_args(interval, args.engine_backend, vllm_args)
    engine = launch_engine(EngineConfig(args.hf_checkpoint, backend=args.engine_backend, dtype=args.engine_dtype,
                                        max_model_len=args.engine_max_model_len, extra_args=extra, rl_routes=False))
    try:
        wait_until_serving([engine], timeout_s=900)
        # One short request first, so that the replay does not time the engine's first-request warm-up.
        asyncio.run(replay(engine.url, samples[:1], args.temperature, interval > 0))
        figures = asyncio.run(replay(engine.url, samples, args.temperature, interval > 0))
    finally:
        engine.stop()
    report = {"rollout_id": args.rollout_id, "samples": len(samples), "stream_interval": interval, **figures}
    print(json.dumps(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
