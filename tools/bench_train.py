"""Trainer throughput on one GPU: fwd+bwd+optimizer steps and forward-only log-prob passes.

Builds vime_ext's real Megatron model for a named Qwen3 shape (random weights, no download) and, in the same
run, the HF ``transformers`` model of that shape (SDPA attention, gradient checkpointing), so every figure is
also a ratio taken in one run. MFU is against a bf16 matmul ceiling measured in the same run.

    python tools/bench_train.py --shape qwen3-4b --seq-lens 4096 8192 16384 \
        --impls megatron-local megatron-sdpa megatron-sdpa-full hf --profile --out results.json

Megatron impls train through the trainer's own loss path (vocab-parallel chunked log-probs); ``--profile`` splits
one step's GPU kernel time by kernel-name category (attention, linear-layer matmuls, norms, loss, optimizer).
"""

import argparse
import json
import time
from dataclasses import asdict, dataclass

import torch

from vime_ext.models.model_config import ModelShape

# Published Qwen3 dense shapes (hidden, layers, heads, kv heads, ffn, tied embeddings); head_dim 128.
SHAPES = {
    "qwen3-0.6b": (1024, 28, 16, 8, 3072, True),
    "qwen3-1.7b": (2048, 28, 16, 8, 6144, True),
    "qwen3-4b": (2560, 36, 32, 8, 9728, True),
    "qwen3-8b": (4096, 36, 32, 8, 12288, False),
}


def hf_config(name: str) -> dict:
    hidden, layers, heads, kv, ffn, tied = SHAPES[name]
    return {"model_type": "qwen3", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": 128, "intermediate_size": ffn, "vocab_size": 151936,
            "tie_word_embeddings": tied, "max_position_embeddings": 40960, "rope_theta": 1_000_000.0,
            "rms_norm_eps": 1e-6, "hidden_act": "silu"}


def flops_per_token(shape: ModelShape, seq: int) -> float:
    """Model FLOPs of one token in fwd+bwd: 6 x matmul params (lm_head included) + attention scores (PaLM's
    12 x layers x heads x head_dim x seq, no causal discount)."""
    h, d = shape.hidden_size, shape.head_dim
    attn = h * d * (shape.num_attention_heads + 2 * shape.num_query_groups) + shape.num_attention_heads * d * h
    mlp = 3 * h * shape.ffn_hidden_size
    params = shape.num_layers * (attn + mlp) + h * shape.vocab_size
    return 6 * params + 12 * shape.num_layers * shape.num_attention_heads * d * seq


def print_and_save(result: dict, out: str | None) -> None:
    """A benchmark's result as indented JSON on stdout and, with ``out``, in that file."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        from pathlib import Path

        Path(out).write_text(text)


def matmul_ceiling_tflops(n: int = 8192, reps: int = 10) -> float:
    a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda",
                                                                                dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


@dataclass
class Result:
    impl: str
    seq_len: int
    micro_batch: int
    step_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    logprob_tokens_per_s: float | None = None
    peak_gib: float | None = None
    error: str | None = None
    time_split: dict | None = None
    matmul_split: dict | None = None
    logprob_time_split: dict | None = None


def build(impl: str, shape: ModelShape, config: dict):
    if impl == "hf":
        from transformers import AutoModelForCausalLM, Qwen3Config

        model = AutoModelForCausalLM.from_config(Qwen3Config(**{k: v for k, v in config.items()
                                                              if k != "model_type"}),
                                                 dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
        model.gradient_checkpointing_enable()
        model.config.use_cache = False

        def loss_fn(ids, labels):
            return model(input_ids=ids, labels=labels).loss

        def log_probs_fn(ids):  # fp32 log-softmax in row chunks, as a careful HF trainer would
            logits = model(input_ids=ids).logits[:, :-1]
            targets = ids[:, 1:]
            return torch.cat([torch.log_softmax(logits[:, i:i + 4096].float(), -1).gather(
                -1, targets[:, i:i + 4096].unsqueeze(-1)).squeeze(-1) for i in range(0, targets.shape[1], 4096)], 1)
        return model, loss_fn, log_probs_fn
    from vime_ext.trainer.forward import forward_log_probs, vocab_parallel_log_probs
    from vime_ext.trainer.packing import model_inputs

    model = build_megatron(impl, shape)

    def loss_fn(ids, labels):  # the trainer's loss path: vocab-parallel chunked log-probs of the targets
        logits = model(**model_inputs(ids, None))
        return -torch.cat([vocab_parallel_log_probs(logits[row], labels[row], shape)
                           for row in range(ids.shape[0])]).mean()

    def log_probs_fn(ids):  # the trainer's own pass: vocab-parallel, fp32 in chunks
        return forward_log_probs(model, shape, ids)
    return model, loss_fn, log_probs_fn


def build_megatron(impl: str, shape: ModelShape):
    from vime_ext.models.model_config import ParallelConfig
    from vime_ext.trainer.model_provider import build_gpt_model, norms_in_model_dtype

    base = impl.removesuffix(FP32_NORMS)
    attention, recompute, layers = MEGATRON_IMPLS[base.removesuffix(UNFUSED_ROPE)]
    model = build_gpt_model(shape, ParallelConfig(), dtype=torch.bfloat16, recompute=recompute, attention=attention,
                            recompute_num_layers=layers, rope_fusion=False if base.endswith(UNFUSED_ROPE) else None)
    if impl.endswith(FP32_NORMS):  # as megatron-core builds them, before build_gpt_model cast them to bf16
        norms_in_model_dtype(model, torch.float32)
    return model


# impl -> (attention, recompute, recomputed layers) for the Megatron model; "hf" is the transformers peer.
MEGATRON_IMPLS = {"megatron-local": ("local", "full", None), "megatron-local-norecompute": ("local", None, None),
                  "megatron-sdpa": ("sdpa", None, None), "megatron-sdpa-full": ("sdpa", "full", None),
                  "megatron-sdpa-selective": ("sdpa", "selective", None),
                  **{f"megatron-sdpa-block{n}": ("sdpa", "full", n) for n in (6, 12, 18, 24, 30)}}
# "<sdpa impl>-unfused-rope": the same model with megatron's unfused RoPE (the SDPA spec fuses it by default).
UNFUSED_ROPE = "-unfused-rope"
SDPA_UNFUSED = [f"{name}{UNFUSED_ROPE}" for name, (attention, _, _) in MEGATRON_IMPLS.items() if attention == "sdpa"]
# "<impl>-fp32-norms": the norms' weights left in fp32, which keeps torch.rms_norm off its fused kernel.
FP32_NORMS = "-fp32-norms"

# Profiler kernel names -> where the time went (by name pattern, first match wins).
KERNEL_CATEGORIES = [
    # torch.compile's kernels (the trainer's log-prob arithmetic): named triton_{poi,red,per}_fused_<ops>, whose
    # op names would otherwise file them under copies or norms
    ("compiled (Triton)", ("triton_",)),
    ("communication", ("nccl",)),  # before the copies: an all-reduce's name holds "reduce"
    ("rope (fused)", ("rope",)),
    ("attention", ("flash", "fmha", "attention", "sdpa", "baddbmm", "bmm", "softmax_warp", "masked_softmax")),
    ("optimizer", ("adam", "multi_tensor")),
    ("loss / log-prob", ("cross_entropy", "log_softmax", "logsoftmax", "nll_loss")),
    ("norms", ("rms", "norm")),
    ("matmul (linear layers)", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "wgmma")),
    ("elementwise / copies", ("elementwise", "vectorized", "copy", "cat", "index", "reduce", "fill")),
]


def _shares(totals: dict[str, float]) -> dict[str, float]:
    whole = sum(totals.values()) or 1.0
    return {k: round(v / whole, 4) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def matmul_role(dims: list[int], shape: ModelShape) -> str:
    """Which layer a 2-D matmul belongs to, from its operand sizes: any FFN size -> MLP, the vocabulary -> LM
    head, otherwise the attention projections (q/k/v and output); forward and both backward matmuls alike."""
    if any(d in (shape.ffn_hidden_size, 2 * shape.ffn_hidden_size) for d in dims):
        return "MLP"
    if any(d >= shape.vocab_size for d in dims):
        return "LM head"
    return "attention projections"


@dataclass
class KernelProfile:
    """One profiled call: the share of CUDA kernel time per kernel category, the share of matrix-multiply time per
    layer role (``matmul_role``), the kernels' summed seconds and the call's wall seconds under the profiler (their
    ratio: how busy the device was, as far as kernels on one stream go), and the kernels that took the most time
    (``top_kernels``: name, seconds, calls), which say what a category such as "other" holds."""
    kernel_split: dict[str, float]
    matmul_split: dict[str, float]
    kernel_s: float
    wall_s: float
    top_kernels: list[tuple[str, float, int]]


def kernel_category(name: str) -> str:
    """The KERNEL_CATEGORIES entry a CUDA kernel's name falls in (the first that matches), else "other"."""
    name = name.lower()
    return next((c for c, keys in KERNEL_CATEGORIES if any(k in name for k in keys)), "other")


def top_kernels(kernels: dict[str, list[float]], n: int = 15) -> list[tuple[str, float, int]]:
    """The ``n`` kernels with the most summed device time, from {name: [microseconds, calls]}: (name cut to 100
    characters, seconds, calls)."""
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:n]
    return [(name[:100], round(us / 1e6, 4), int(calls)) for name, (us, calls) in ranked]


def profile_split(step_fn, shape: ModelShape) -> KernelProfile:
    """``step_fn`` called once under torch's profiler, its kernels read back (``KernelProfile``); the operand
    shapes recorded for every ``aten::mm`` give the matmuls' roles."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        torch.cuda.synchronize()
        begin = time.perf_counter()
        step_fn()
        torch.cuda.synchronize()
        wall_s = time.perf_counter() - begin
    categories: dict[str, float] = {}
    roles: dict[str, float] = {}
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:  # a kernel
            category = kernel_category(event.name)
            categories[category] = categories.get(category, 0.0) + event.device_time_total
            totals = kernels.setdefault(event.name, [0.0, 0])
            totals[0] += event.device_time_total
            totals[1] += 1
        elif event.name == "aten::mm" and event.input_shapes and len(event.input_shapes) >= 2:
            role = matmul_role([d for s in event.input_shapes[:2] for d in s], shape)
            roles[role] = roles.get(role, 0.0) + event.device_time_total
    return KernelProfile(_shares(categories), _shares(roles), sum(categories.values()) / 1e6, wall_s,
                         top_kernels(kernels))


def bench(impl: str, shape: ModelShape, config: dict, seq: int, mbs: int, steps: int, ceiling: float,
          profile: bool = False) -> Result:
    result = Result(impl, seq, mbs)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        model, loss_fn, log_probs_fn = build(impl, shape, config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
        ids = torch.randint(0, shape.vocab_size, (mbs, seq + 1), device="cuda")
        inputs, labels = ids[:, :-1], ids[:, 1:]

        def train_step():
            optimizer.zero_grad(set_to_none=True)
            loss_fn(inputs, labels).backward()
            optimizer.step()

        times = []
        for step in range(steps + 2):  # two warm-up steps
            torch.cuda.synchronize()
            start = time.perf_counter()
            train_step()
            torch.cuda.synchronize()
            if step >= 2:
                times.append(time.perf_counter() - start)
        if profile:
            profiled = profile_split(train_step, shape)
            result.time_split, result.matmul_split = profiled.kernel_split, profiled.matmul_split
        result.step_s = sum(times) / len(times)
        result.tokens_per_s = mbs * seq / result.step_s
        result.tflops = result.tokens_per_s * flops_per_token(shape, seq) / 1e12
        result.mfu = result.tflops / ceiling
        model.zero_grad(set_to_none=True)
        with torch.no_grad():  # a log-prob pass: forward only, no activations kept for backward
            timings = []
            # Two warm-up passes, as for training: the first passes after training also grow the allocator's
            # pool for the new tensor sizes (one warm-up measured 29k tok/s where the steady state is 42k).
            for step in range(steps + 2):
                torch.cuda.synchronize()
                start = time.perf_counter()
                log_probs_fn(ids)
                torch.cuda.synchronize()
                if step >= 2:
                    timings.append(time.perf_counter() - start)
            result.logprob_tokens_per_s = mbs * (seq + 1) / (sum(timings) / len(timings))
            if profile:
                result.logprob_time_split = profile_split(lambda: log_probs_fn(ids), shape).kernel_split
    except torch.cuda.OutOfMemoryError:
        result.error = "out of memory"
    finally:
        result.peak_gib = torch.cuda.max_memory_allocated() / 2**30
        model = optimizer = None  # noqa: F841
        torch.cuda.empty_cache()
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--micro-batch-size", type=int, default=1)
    parser.add_argument("--impls", nargs="+", default=["megatron-local", "megatron-sdpa", "hf"],
                        choices=[*MEGATRON_IMPLS, *SDPA_UNFUSED, *(f"{name}{FP32_NORMS}" for name in MEGATRON_IMPLS),
                                 "hf"])
    parser.add_argument("--profile", action="store_true", help="also split one step's kernel time by category")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_train.py needs a CUDA GPU")

    from vime_ext.models.model_config import ParallelConfig
    from vime_ext.trainer.parallel import init_distributed

    init_distributed(ParallelConfig())
    config = hf_config(args.shape)
    shape = ModelShape.from_hf_config(config, source=args.shape)
    ceiling = matmul_ceiling_tflops()
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | {args.shape} | bf16 matmul ceiling "
          f"{ceiling:.0f} TFLOP/s")
    results = []
    print(f"{'impl':28} {'seq':>6} {'s/step':>8} {'tok/s':>8} {'TFLOP/s':>8} {'MFU':>6} {'logprob tok/s':>14} "
          f"{'peak GiB':>9}")
    for seq in args.seq_lens:
        for impl in args.impls:
            r = bench(impl, shape, config, seq, args.micro_batch_size, args.steps, ceiling, args.profile)
            results.append(r)
            if r.error:
                print(f"{impl:28} {seq:>6} {r.error:>37} {'':>14} {r.peak_gib:>9.1f}")
            else:
                print(f"{impl:28} {seq:>6} {r.step_s:>8.3f} {r.tokens_per_s:>8.0f} {r.tflops:>8.1f} "
                      f"{r.mfu:>6.1%} {r.logprob_tokens_per_s:>14.0f} {r.peak_gib:>9.1f}", flush=True)
                if r.time_split:
                    print(f"{'':28} time split: " + ", ".join(f"{k} {v:.0%}" for k, v in r.time_split.items()))
                    print(f"{'':28} matmul split: " + ", ".join(f"{k} {v:.0%}" for k, v in r.matmul_split.items()))
                if r.logprob_time_split:
                    print(f"{'':28} log-prob split: " + ", ".join(f"{k} {v:.0%}"
                                                               for k, v in r.logprob_time_split.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": args.shape,
                       "ceiling_tflops": ceiling, "results": [asdict(r) for r in results]}, f, indent=1)


if __name__ == "__main__":
    main()
