"""The largest micro-batch token budget the trainer's RL step fits in on one GPU, per model shape.

    python tools/bench_memory.py --shapes qwen3-0.6b qwen3-1.7b qwen3-4b qwen3-8b --offload both --out mem.json

For each shape (and with/without ``--optimizer-cpu-offload``) a ``TrainActor`` is built as training builds it
(bf16, megatron-core's distributed optimizer, gradients accumulated in bf16, no reference model, no activation
recomputation, ``--trainer-flags`` added), then one RL step (old log-probs, forward-backward, optimizer) runs on
a rollout that fills one micro-batch of N tokens (packed sequences of at most ``--sequence-len`` tokens each).
N doubles from ``--start`` until the step runs out of memory, then ``--bisect`` halvings narrow the gap. Reported
per configuration: the largest N that trained, the smallest that did not, the peak memory of each trial, and the
memory held before any step (weights, gradient buffer, optimizer states).

The weights are random normal values drawn on the GPU under the real checkpoint's tensor names (a reader that
stands in for the safetensors one), so an 8B shape needs no 16 GB file; their values change neither memory nor
time. Prints one JSON object.
"""

import argparse
import dataclasses
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.bench_rl_step import synthetic_rollout  # noqa: E402
from tools.bench_train import SHAPES, hf_config, print_and_save  # noqa: E402


class RandomHFReader:
    """``HFCheckpointReader``'s ``get`` for a shape's tensor names, each drawn on the GPU when asked for."""

    def __init__(self, shape_name: str):
        from transformers import AutoModelForCausalLM, Qwen3Config

        config = hf_config(shape_name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                Qwen3Config(**{k: v for k, v in config.items() if k != "model_type"}))
        self.shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}

    def __call__(self, _hf_dir):  # stands in for the class: TrainActor calls HFCheckpointReader(path)
        return self

    def get(self, name: str) -> torch.Tensor:
        if "norm" in name:
            return torch.ones(self.shapes[name], dtype=torch.bfloat16, device="cuda")
        return torch.randn(self.shapes[name], dtype=torch.bfloat16, device="cuda") * 0.02


def trial(actor, config, tokens: int, sequence_len: int, vocab: int) -> tuple[bool, float]:
    """One RL step (one optimizer step) with one micro-batch of ``tokens`` tokens: (trained, peak GiB)."""
    count = max(tokens // sequence_len, 1)
    length = tokens // count
    sequences = synthetic_rollout(vocab, count, length, length, prompt=min(256, length // 2))
    actor.config = dataclasses.replace(
        config, trainer=dataclasses.replace(config.trainer, max_tokens_per_gpu=count * length))
    step = [(float(sum(s.num_loss_tokens for s in sequences)), float(count))]
    torch.cuda.reset_peak_memory_stats()
    try:
        actor.train_rollout([sequences], step)
        torch.cuda.synchronize()
        trained = True
    except torch.OutOfMemoryError:
        trained = False
    peak = torch.cuda.max_memory_allocated() / 2**30
    actor.optimizer.model.zero_grad_buffer()  # an out-of-memory step may leave gradients behind
    gc.collect()
    torch.cuda.empty_cache()
    return trained, peak


def search(shape_name: str, offload: bool, args) -> dict:
    from vime_ext.arguments import parse_train_args
    from vime_ext.convert import hf_checkpoint
    from vime_ext.models.model_config import ModelShape
    from vime_ext.net import free_port
    from vime_ext.trainer.actor import TrainActor

    root = Path(tempfile.mkdtemp(prefix="bench_memory_"))
    config_json = {**hf_config(shape_name), "architectures": ["Qwen3ForCausalLM"], "torch_dtype": "bfloat16"}
    (root / "config.json").write_text(json.dumps(config_json))
    (root / "p.jsonl").write_text(json.dumps({"prompt": "x", "label": "y"}) + "\n")
    flags = ["--hf-checkpoint", str(root), "--prompt-data", str(root / "p.jsonl"), "--bf16",
             "--rollout-batch-size", "1", "--n-samples-per-prompt", "1", "--global-batch-size", "1",
             "--use-dynamic-batch-size", "--max-tokens-per-gpu", str(args.start), "--lr", "1e-6",
             "--use-distributed-optimizer", *args.trainer_flags.split()]
    if offload:
        flags += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d"]
    config = parse_train_args(flags)
    real_reader = hf_checkpoint.HFCheckpointReader
    hf_checkpoint.HFCheckpointReader = RandomHFReader(shape_name)
    start = time.perf_counter()
    try:
        actor = TrainActor(config, 0, 1, "127.0.0.1", free_port(), local_rank=0)
    finally:
        hf_checkpoint.HFCheckpointReader = real_reader
    build_s = time.perf_counter() - start
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated() / 2**30
    vocab = ModelShape.from_hf_dir(root).vocab_size
    trials, good, bad = [], 0, None
    tokens = args.start
    while bad is None and tokens <= args.limit:  # double until a step runs out of memory
        ok, peak = trial(actor, config, tokens, args.sequence_len, vocab)
        trials.append({"tokens": tokens, "trained": ok, "peak_gib": round(peak, 1)})
        print(f"{shape_name} offload={offload}: {tokens} tokens -> {'ok' if ok else 'OOM'} "
              f"(peak {peak:.1f} GiB)", flush=True)
        good, bad = (tokens, None) if ok else (good, tokens)
        tokens *= 2
    for _ in range(args.bisect if bad is not None and good else 0):
        tokens = (good + bad) // 2 // 1024 * 1024
        if tokens in (good, bad):
            break
        ok, peak = trial(actor, config, tokens, args.sequence_len, vocab)
        trials.append({"tokens": tokens, "trained": ok, "peak_gib": round(peak, 1)})
        print(f"{shape_name} offload={offload}: {tokens} tokens -> {'ok' if ok else 'OOM'}", flush=True)
        good, bad = (tokens, bad) if ok else (good, tokens)
    parameters = sum(p.numel() for p in actor.model.parameters())
    actor.shutdown()
    del actor
    gc.collect()
    torch.cuda.empty_cache()
    return {"shape": shape_name, "parameters": parameters, "offload": offload, "largest_trained": good,
            "smallest_oom": bad, "resident_gib": round(resident, 1), "build_s": round(build_s, 1),
            "trials": trials}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"],
                        choices=sorted(SHAPES))
    parser.add_argument("--offload", choices=["no", "yes", "both"], default="both")
    parser.add_argument("--start", type=int, default=4096, help="first token budget tried")
    parser.add_argument("--limit", type=int, default=262144, help="largest token budget tried")
    parser.add_argument("--bisect", type=int, default=2, help="halvings of the gap after the doubling")
    parser.add_argument("--sequence-len", type=int, default=8192, help="longest packed sequence")
    parser.add_argument("--trainer-flags", default="", help="more train.py flags, one string")
    parser.add_argument("--out", default=None)
    parser.add_argument("--one", nargs=2, metavar=("SHAPE", "OFFLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # one configuration, in a process of its own, its result as the last line
        print(json.dumps(search(args.one[0], args.one[1] == "yes", args)), flush=True)
        return
    offloads = {"no": ["no"], "yes": ["yes"], "both": ["no", "yes"]}[args.offload]
    own = list(argv if argv is not None else sys.argv[1:])
    results = []
    for shape_name in args.shapes:
        for offload in offloads:
            # A process per configuration: megatron's buffers and the CUDA caching allocator of one would
            # otherwise count against the next.
            done = subprocess.run([sys.executable, __file__, *own, "--one", shape_name, offload],
                                  capture_output=True, text=True)
            print(done.stdout, end="", flush=True)
            lines = done.stdout.strip().splitlines()
            try:
                results.append(json.loads(lines[-1]))
            except (IndexError, json.JSONDecodeError):
                lines = [line for line in done.stderr.splitlines() if "Error" in line or "error:" in line]
                error = (lines or ["no output, exit status %d" % done.returncode])[-1]
                results.append({"shape": shape_name, "offload": offload == "yes", "error": error})
                print(f"{shape_name} offload={offload}: {error}", flush=True)
            print_and_save({"device": torch.cuda.get_device_name(), "results": results}, args.out)


if __name__ == "__main__":
    main()
