"""The trainer's real RL step on one GPU, timed by phase, against the model-only rate of bench_train.py in the
same run.

    python tools/bench_rl_step.py --shape qwen3-4b --sequences 64 --min-len 512 --max-len 8192 \
        --max-tokens-per-gpu 8192 --out rl_step.json

A Qwen3-shaped HF checkpoint with random bf16 weights is written to a temporary folder (no download) and loaded
by ``TrainActor`` exactly as training loads one; one rollout of ``--sequences`` synthetic sequences (lengths
drawn uniformly in [min, max], the first 256 tokens a masked prompt, packed into micro-batches of at most
``--max-tokens-per-gpu`` tokens, one optimizer step) goes through ``train_rollout``: old and reference log-probs
(forward only), then forward-backward and the optimizer. Reported per phase (seconds, after ``--warmup``
rollouts), tokens/s, MFU (bench_train.py's FLOP count and a matmul ceiling measured in this run), peak memory, and
the model-only fwd+bwd+AdamW rate of bench_train.py for the same shape at ``--max-tokens-per-gpu`` tokens, the
rate to beat (run first, in a process of its own). Prints one JSON object. ``--profile`` adds one rollout under
torch's profiler: the kernels' seconds against the wall's (whether the step waits on the host), by kernel category
and by layer role. W1's training step of the peers bench (256 sequences of 1,280 tokens, one optimizer step):

    python tools/bench_rl_step.py --shape qwen3-0.6b --sequences 256 --min-len 1280 --max-len 1280 \
        --max-tokens-per-gpu 16384 --profile --out rl_step_w1.json
"""

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.bench_train import (SHAPES, flops_per_token, hf_config, matmul_ceiling_tflops, print_and_save,  # noqa: E402
                               profile_split)


def model_only_rate(shape_name: str, tokens: int, recompute: str) -> dict:
    """bench_train.py's fwd+bwd+AdamW step for the shape at ``tokens`` tokens, in a process of its own: after the
    actor, the caching allocator and megatron's buffers of this one left too little for an 8B (or, on an H100, a
    4B) model-only step."""
    impl = "megatron-sdpa" if recompute == "none" else "megatron-sdpa-full"
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "model_only.json"
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("bench_train.py")), "--shape", shape_name,
                               "--seq-lens", str(tokens), "--impls", impl, "--steps", "3", "--out", str(out)],
                              capture_output=True, text=True)
        if done.returncode or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            return {"tokens_per_s": 0, "mfu": None, "peak_gib": None, "error": tail[0]}
        run = json.loads(out.read_text())["results"][0]
    return {"tokens_per_s": round(run["tokens_per_s"] or 0), "mfu": run["mfu"],
            "peak_gib": run["peak_gib"] and round(run["peak_gib"], 1), "error": run["error"]}


def write_random_checkpoint(shape_name: str, folder: Path) -> Path:
    """config.json and random bf16 safetensors for the shape, tensor names and shapes from transformers' own
    model class (built on the meta device, so nothing of the model's size is allocated)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = hf_config(shape_name)
    hf = Qwen3Config(**{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"],
                                                    "torch_dtype": "bfloat16"}))
    generator = torch.Generator().manual_seed(0)
    shard, size, index = {}, 0, {}
    names = [n for n, _ in model.named_parameters()]
    if config["tie_word_embeddings"]:
        names = [n for n in names if n != "lm_head.weight"]
    params = dict(model.named_parameters())
    for name in names:
        p = params[name]
        value = (torch.ones(p.shape) if "norm" in name else torch.randn(p.shape, generator=generator) * 0.02)
        shard[name] = value.to(torch.bfloat16)
        size += shard[name].numel() * 2
        if size > 4 * 2**30:
            file = f"model-{len(set(index.values())):05d}.safetensors"
            save_file(shard, folder / file)
            index.update(dict.fromkeys(shard, file))
            shard, size = {}, 0
    if shard:
        file = f"model-{len(set(index.values())):05d}.safetensors"
        save_file(shard, folder / file)
        index.update(dict.fromkeys(shard, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    return folder


def synthetic_rollout(vocab: int, count: int, min_len: int, max_len: int, prompt: int = 256, seed: int = 0):
    from vime_ext.algorithms.train_data import TrainSequence

    rng = random.Random(seed)
    sequences = []
    for i in range(count):
        n = rng.randint(min_len, max_len)
        tokens = [rng.randrange(vocab) for _ in range(n)]
        mask = [0] * (prompt - 1) + [1] * (n - prompt)
        sequences.append(TrainSequence(tokens, mask, [-2.0] * (n - 1), rng.gauss(0, 1), i, reward=float(i % 2)))
    return sequences


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=8192, help="micro-batch token budget")
    parser.add_argument("--recompute", choices=["none", "full"], default="none")
    parser.add_argument("--kl", action="store_true", help="with a KL term (a reference model and its pass)")
    parser.add_argument("--trainer-flags", default="", help="more train.py flags, one string (e.g. "
                        "\"--use-distributed-optimizer --overlap-grad-reduce\")")
    parser.add_argument("--rollouts", type=int, default=2, help="timed rollouts")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--profile", action="store_true",
                        help="one more rollout under torch's profiler: how busy the device was, and where its "
                             "kernel time went (small shapes wait on the host between kernels)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    from vime_ext.arguments import parse_train_args
    from vime_ext.models.model_config import ModelShape
    from vime_ext.net import free_port
    from vime_ext.driver.step import plan_steps
    from vime_ext.trainer.actor import TrainActor

    # First, while this process holds no GPU memory: the rate to beat.
    model_only = model_only_rate(args.shape, args.max_tokens_per_gpu, args.recompute)
    root = Path(tempfile.mkdtemp(prefix="bench_rl_step_"))
    start = time.perf_counter()
    folder = write_random_checkpoint(args.shape, root / args.shape)
    prompts = root / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "x", "label": "y"}) + "\n")
    written_s = time.perf_counter() - start
    flags = ["--hf-checkpoint", str(folder), "--prompt-data", str(prompts), "--bf16",
             "--rollout-batch-size", str(args.sequences), "--n-samples-per-prompt", "1",
             "--global-batch-size", str(args.sequences), "--use-dynamic-batch-size",
             "--max-tokens-per-gpu", str(args.max_tokens_per_gpu), "--lr", "1e-6", "--eps-clip-high", "0.28"]
    flags += args.trainer_flags.split()
    if args.kl:
        flags += ["--use-kl-loss", "--kl-loss-coef", "0.001"]
    if args.recompute == "full":
        flags += ["--recompute-granularity", "full"]
    config = parse_train_args(flags)
    shape = ModelShape.from_hf_dir(folder)
    actor = TrainActor(config, 0, 1, "127.0.0.1", free_port(), local_rank=0)
    load_s = time.perf_counter() - start - written_s
    sequences = synthetic_rollout(shape.vocab_size, args.sequences, args.min_len, args.max_len)
    samples = [type("S", (), {"index": s.sample_index})() for s in sequences]
    per_rank, totals = plan_steps(config, samples, sequences, 1)

    optimizer_times: list[float] = []
    step = actor.optimizer.step

    def timed_step():  # the optimizer's share of the step, synchronised on both sides
        torch.cuda.synchronize()
        begin = time.perf_counter()
        out = step()
        torch.cuda.synchronize()
        optimizer_times.append(time.perf_counter() - begin)
        return out
    actor.optimizer.step = timed_step

    torch.cuda.reset_peak_memory_stats()
    phases = []
    for rollout in range(args.warmup + args.rollouts):
        optimizer_times.clear()
        torch.cuda.synchronize()
        begin = time.perf_counter()
        result = actor.train_rollout(per_rank[0], totals)
        torch.cuda.synchronize()
        total = time.perf_counter() - begin
        if rollout >= args.warmup:
            opt = sum(optimizer_times)
            phases.append({"log_probs_s": result.log_prob_time, "train_s": result.train_time,
                           "optimizer_s": opt, "forward_backward_s": result.train_time - opt, "total_s": total})
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    profiled = None
    if args.profile:  # after the timed rollouts, so the profiler's own cost touches no timed figure
        profiled = profile_split(lambda: actor.train_rollout(per_rank[0], totals), shape)
    median = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    train_tokens = sum(len(s.tokens) for s in sequences)
    flops = sum(len(s.tokens) * flops_per_token(shape, len(s.tokens)) for s in sequences)
    parameters = sum(p.numel() for p in actor.model.parameters())
    optimizer_name = type(actor.optimizer).__name__
    actor.shutdown()
    del actor
    torch.cuda.empty_cache()

    ceiling = matmul_ceiling_tflops()
    fb_opt = median["forward_backward_s"] + median["optimizer_s"]
    result = {
        "device": torch.cuda.get_device_name(), "shape": args.shape, "parameters": parameters,
        "sequences": args.sequences,
        "lengths": [args.min_len, args.max_len], "tokens": train_tokens,
        "max_tokens_per_gpu": args.max_tokens_per_gpu, "kl": args.kl, "recompute": args.recompute,
        "optimizer": optimizer_name, "trainer_flags": args.trainer_flags,
        "checkpoint_write_s": round(written_s, 1), "actor_load_s": round(load_s, 1),
        "phases_s": {k: round(v, 3) for k, v in median.items()},
        "optimizer_share_of_train": round(median["optimizer_s"] / median["train_s"], 3),
        "train_tokens_per_s": round(train_tokens / fb_opt), "train_mfu": round(flops / fb_opt / 1e12 / ceiling, 3),
        "rl_step_tokens_per_s": round(train_tokens / median["total_s"]), "peak_gib": round(peak_gib, 1),
        "matmul_ceiling_tflops": round(ceiling, 1),
        "model_only": model_only,
    }
    if profiled:
        result["profile"] = {"wall_s": round(profiled.wall_s, 3), "kernel_s": round(profiled.kernel_s, 3),
                             "device_busy": round(profiled.kernel_s / profiled.wall_s, 3),
                             "kernel_s_of_unprofiled_total": round(profiled.kernel_s / median["total_s"], 3),
                             "kernel_split": profiled.kernel_split, "matmul_split": profiled.matmul_split,
                             "top_kernels": profiled.top_kernels}
    if model_only["tokens_per_s"]:
        result["train_vs_model_only"] = round(result["train_tokens_per_s"] / model_only["tokens_per_s"], 3)
    print_and_save(result, args.out)


if __name__ == "__main__":
    main()
