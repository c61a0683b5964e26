"""The trainer's log-prob kernel (``vime_ext/trainer/log_probs.py``) alone: forward with the entropy, then
backward, over one micro-batch of vocabulary logits, eager against compiled, in one run.

    python tools/bench_log_probs.py --tokens 16384 --vocab 151936 --out log_probs.json

W1's micro-batch on a Qwen3 vocabulary by default. Needs torch only (no megatron), so it runs before a GPU
machine's wheel set is installed. Prints one JSON object: per mode the median milliseconds of forward and of
backward, the bytes the logits and their gradient must move at least (one read, one write) over that time, and
the compiled mode's largest difference from the eager values, entropy and gradient.
"""

import argparse
import json
import statistics
import time

import torch

from vime_ext.trainer import log_probs


def timed(fn, device: torch.device, repeats: int) -> tuple[float, object]:
    """Median seconds of ``fn()`` over ``repeats`` calls after two warm-up calls (the compile, the allocator)."""
    times, out = [], None
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        begin = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - begin)
    return statistics.median(times), out


def run(mode: str, logits: torch.Tensor, targets: torch.Tensor, chunk: int, repeats: int) -> tuple[dict, tuple]:
    """One mode's forward and backward timings and its outputs (values, entropy, gradient)."""
    log_probs.use_compiled("all" if mode == "compiled" else "off")  # on any device: the two on whatever runs
    try:
        x = logits.detach().requires_grad_(True)
        grad_out = torch.ones(targets.numel(), device=logits.device)

        def forward():
            with torch.no_grad():
                return log_probs.chunked_log_probs(x, targets, 0, logits.shape[-1], chunk, with_entropy=True)

        def backward():
            x.grad = None
            values, _ = log_probs.chunked_log_probs(x, targets, 0, logits.shape[-1], chunk, with_entropy=True)
            values.backward(grad_out)
            return x.grad

        forward_s, (values, entropy) = timed(forward, logits.device, repeats)
        # backward's figure includes the forward it needs; the forward alone is taken off
        both_s, grad = timed(backward, logits.device, repeats)
    finally:
        log_probs.use_compiled("cuda")
    moved = logits.numel() * logits.element_size()
    figures = {"forward_ms": round(forward_s * 1e3, 2), "backward_ms": round((both_s - forward_s) * 1e3, 2),
               "forward_gb_per_s_at_one_read": round(moved / forward_s / 1e9, 1),
               "backward_gb_per_s_at_one_read_one_write": round(2 * moved / max(both_s - forward_s, 1e-9) / 1e9, 1)}
    return figures, (values, entropy, grad)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384, help="rows of logits: one micro-batch's tokens")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--chunk", type=int, default=4096, help="--log-probs-chunk-size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    generator = torch.Generator(device=device).manual_seed(0)
    logits = (3 * torch.randn(args.tokens, args.vocab, device=device, generator=generator)).to(torch.bfloat16)
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=generator)
    eager, reference = run("eager", logits, targets, args.chunk, args.repeats)
    compiled, outputs = run("compiled", logits, targets, args.chunk, args.repeats)
    compiled["max_abs_diff"] = {name: float((ours.float() - theirs.float()).abs().max())
                                for name, ours, theirs in zip(("values", "entropy", "gradient"), outputs, reference)}
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "tokens": args.tokens, "vocab": args.vocab, "chunk": args.chunk,
              "eager": eager, "compiled": compiled,
              "compiled_speedup": round((eager["forward_ms"] + eager["backward_ms"])
                                        / (compiled["forward_ms"] + compiled["backward_ms"]), 2)}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
