"""Packed (THD) against right-padded micro-batches on an RL-like batch of varied lengths, on one GPU.

An RL rollout's sequences range from a short prompt plus a short answer to the length limit. The trainer packs
each micro-batch's sequences end to end (``--pack-sequences``, the default); ``--no-pack-sequences`` pads them to
the longest. Both go through the trainer's own code here: ``micro_batches`` under one token budget, the
old-policy log-prob pass (``forward_log_probs``), and the policy loss (``micro_batch_loss``) with backward and an
optimizer step, on vime_ext's Megatron model of a named Qwen3 shape (random weights, no download). Throughput
counts real tokens only (padding is work, not progress); both layouts run in the same process, so the ratio is
taken in one run.

    python tools/bench_packing.py --shape qwen3-4b --impl megatron-sdpa-block12 --budget 8192 \
        --min-len 512 --max-len 8192 --sequences 24 --log-prob-budgets 8192 16384 --out packing.json
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_train import MEGATRON_IMPLS, SHAPES, build_megatron, flops_per_token, hf_config, matmul_ceiling_tflops  # noqa: E402

from vime_ext.algorithms.train_data import TrainSequence  # noqa: E402
from vime_ext.models.model_config import ModelShape  # noqa: E402


def rl_sequences(count: int, min_len: int, max_len: int, vocab: int, seed: int) -> list[TrainSequence]:
    """Lengths uniform in [min_len, max_len]; the first eighth of each sequence is prompt (no loss)."""
    rng = random.Random(seed)
    sequences = []
    for i in range(count):
        n = rng.randint(min_len, max_len)
        prompt = max(n // 8, 1)
        tokens = [rng.randrange(vocab) for _ in range(n)]
        sequences.append(TrainSequence(tokens, [0] * (prompt - 1) + [1] * (n - prompt), [-1.0] * (n - 1),
                                       rng.choice([-1.0, 1.0]), i))
    return sequences


def timed(fn, repeats: int) -> float:
    """Mean seconds of ``fn()`` over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sum(times) / len(times)


def profile_cpu(fn, top: int = 12) -> dict:
    """One call of ``fn`` under the profiler: wall time, GPU kernel time, and the host ops with the most self
    CPU time (where a pass that is slower than its kernels spends the difference)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    kernels = sum(e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    host = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    return {"wall_ms": wall * 1e3, "kernel_ms": kernels / 1e3,
            "host_ops": {e.key: [round(e.self_cpu_time_total / 1e3, 2), e.count] for e in host}}


def bench_layout(model, optimizer, shape: ModelShape, sequences: list[TrainSequence], packed: bool,
                 budget: int | None, micro_batch_size: int, log_prob_budgets: list[int], repeats: int,
                 ceiling: float, profile: bool = False) -> dict:
    from vime_ext.trainer.batching import micro_batches
    from vime_ext.trainer.forward import forward_log_probs
    from vime_ext.trainer.packing import model_inputs
    from vime_ext.trainer.rl_loss import LossSettings, micro_batch_loss

    pack = 1 if packed else None
    batches = [b.to("cuda") for b in micro_batches(sequences, micro_batch_size, max_tokens=budget,
                                                   pack_multiple=pack)]
    real = sum(len(s.tokens) for s in sequences)
    model_tokens = sum(b.num_tokens for b in batches)
    total_loss_tokens = float(sum(b.loss_mask.sum() for b in batches))
    for b in batches:  # the old-policy log-probs the loss needs
        b.old_log_probs = forward_log_probs(model, shape, b.tokens, packing=b.packing)

    def train_rollout():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        for b in batches:
            logits = model(**model_inputs(b.tokens, b.packing))
            loss, _ = micro_batch_loss(logits, b, shape, LossSettings(), total_loss_tokens, len(sequences))
            loss.backward()
        optimizer.step()

    torch.cuda.reset_peak_memory_stats()
    seconds = timed(train_rollout, repeats)
    flops = sum(len(s.tokens) * flops_per_token(shape, len(s.tokens)) for s in sequences)
    result = {"layout": "packed" if packed else "padded", "micro_batches": len(batches),
              "model_tokens": model_tokens, "real_tokens": real, "padding_share": 1 - real / model_tokens,
              "train_s": seconds, "train_tokens_per_s": real / seconds, "tflops": flops / seconds / 1e12,
              "mfu": flops / seconds / 1e12 / ceiling, "train_peak_gib": torch.cuda.max_memory_allocated() / 2**30,
              "log_prob": {}}
    for lp_budget in log_prob_budgets:
        passes = [b.to("cuda") for b in micro_batches(sequences, max_tokens=lp_budget, pack_multiple=pack)]

        def log_probs():
            for b in passes:
                forward_log_probs(model, shape, b.tokens, packing=b.packing)

        lp_seconds = timed(log_probs, repeats)
        result["log_prob"][lp_budget] = {"passes": len(passes), "tokens_per_s": real / lp_seconds,
                                         "ratio_to_train": seconds / lp_seconds}
        if profile and lp_budget == log_prob_budgets[0]:
            result["log_prob_profile"] = profile_cpu(log_probs)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--impl", default="megatron-sdpa", choices=sorted(MEGATRON_IMPLS))
    parser.add_argument("--budget", type=int, default=8192, help="training micro-batch token budget (0: none, "
                                                                 "--micro-batch-size sequences per micro-batch)")
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--log-prob-budgets", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--sequences", type=int, default=24)
    parser.add_argument("--min-len", type=int, default=512)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true",
                        help="profile the log-prob passes at the first budget: wall vs kernel time, top host ops")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_packing.py needs a CUDA GPU")

    from vime_ext.models.model_config import ParallelConfig
    from vime_ext.trainer.parallel import init_distributed

    init_distributed(ParallelConfig())
    shape = ModelShape.from_hf_config(hf_config(args.shape), source=args.shape)
    ceiling = matmul_ceiling_tflops()
    budget = args.budget or None
    sequences = rl_sequences(args.sequences, args.min_len, min(args.max_len, budget or args.max_len),
                             shape.vocab_size, args.seed)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | {args.shape} {args.impl} | bf16 matmul "
          f"ceiling {ceiling:.0f} TFLOP/s | {len(sequences)} sequences of {args.min_len}-{args.max_len} tokens, "
          f"{sum(len(s.tokens) for s in sequences)} in all | " +
          (f"budget {budget}" if budget else f"{args.micro_batch_size} sequences per micro-batch"))
    model = build_megatron(args.impl, shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7, fused=True)
    results = []
    for packed in (False, True):
        r = bench_layout(model, optimizer, shape, sequences, packed, budget, args.micro_batch_size,
                         args.log_prob_budgets, args.repeats, ceiling, args.profile)
        results.append(r)
        print(f"{r['layout']:7} {r['micro_batches']:3} micro-batches, {r['padding_share']:6.1%} padding | train "
              f"{r['train_s']:7.2f} s, {r['train_tokens_per_s']:7.0f} real tok/s, MFU {r['mfu']:6.1%}, peak "
              f"{r['train_peak_gib']:5.1f} GiB | log-prob " + ", ".join(
                  f"budget {k}: {v['tokens_per_s']:.0f} tok/s ({v['ratio_to_train']:.2f}x train)"
                  for k, v in r["log_prob"].items()), flush=True)
        if "log_prob_profile" in r:
            prof = r["log_prob_profile"]
            print(f"        log-prob passes at budget {args.log_prob_budgets[0]}: {prof['wall_ms']:.0f} ms wall, "
                  f"{prof['kernel_ms']:.0f} ms of kernels; most host time: " + ", ".join(
                      f"{k} {ms:.1f} ms/{n}" for k, (ms, n) in prof["host_ops"].items()))
    padded, packed = results
    first = args.log_prob_budgets[0]
    lp_ratio = packed["log_prob"][first]["tokens_per_s"] / padded["log_prob"][first]["tokens_per_s"]
    print(f"packed / padded: training {padded['train_s'] / packed['train_s']:.2f}x, log-prob (budget {first}) "
          f"{lp_ratio:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "shape": args.shape, "impl": args.impl, "args": vars(args),
                                              "ceiling_tflops": ceiling, "results": results}, indent=1))


if __name__ == "__main__":
    main()
