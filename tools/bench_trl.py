"""TRL's ``GRPOTrainer`` on one of ``tools/bench_peers.py``'s workloads: run by bench_peers (``--frameworks trl``)
in a process of its own, it writes one line of figures per optimizer step to ``OUT/trl_steps.jsonl`` in the names
bench_peers reads (``time/total``, ``time/rollout``, ``time/weight_sync``, ``memory/peak_allocated_gb``).

    python tools/bench_trl.py --workload w1 --model-dir DIR --prompts OUT/prompts.jsonl --out OUT [--engine-memory 0.5]

The workload's settings, in TRL's terms: one generation batch of prompts x samples completions per optimizer step
(``generation_batch_size`` = ``per_device_train_batch_size`` x ``gradient_accumulation_steps``, one iteration),
``max_completion_length`` = the response length with vLLM's ``ignore_eos``, temperature 1, no KL (``beta`` 0), bf16,
lr 1e-6, the bench's hash reward on the completion text. On a GPU, vLLM colocated in the trainer's process
(``vllm_mode="colocate"``) with sleep mode on, as this project's engine sleeps while its trainer trains (TRL sleeps
at level 2, weights dropped). On the CPU (the ``tiny`` workload), transformers' ``generate``: a smoke of this path.

What TRL keeps that this project does not: bf16 weights and Adam states (``bf16=True`` trains the bf16 model),
where megatron keeps fp32 masters; its own loss default (``loss_type``), named in the figures it writes. TRL's
``GRPOConfig`` turns gradient checkpointing on by default (its backward recomputes the forward; this project's
trainer recomputes nothing unless asked): ``--no-gradient-checkpointing`` runs without it, where memory allows.
Phases: TRL's own profiling contexts (``vLLM.generate``, ``sync_weights``); the rest of a step is the
log-prob and training passes, which it does not time apart.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench_peers import WORKLOADS  # noqa: E402
from tools.bench_plugins import text_reward  # noqa: E402


def hash_reward(prompts, completions, **_) -> list[float]:
    """The bench's reward (tools/bench_plugins.py) as TRL calls a reward function."""
    return [text_reward(c) for c in completions]


class Timings:
    """TRL's profiling contexts report only to wandb, mlflow or trackio: their durations are collected here."""

    def __init__(self):
        self.current: dict[str, float] = {}

    def install(self) -> None:
        from trl.extras import profiling

        timings = self

        def log(context, duration: float) -> None:
            timings.current[context.name] = timings.current.get(context.name, 0.0) + duration

        profiling.ProfilingContext._log_metrics = log

    def take(self) -> dict[str, float]:
        current, self.current = self.current, {}
        return current


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="w1")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="bench_peers' prompt file")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--engine-memory", type=float, default=0.5, help="vLLM's share of the GPU")
    parser.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                        help="train without recomputing activations (GRPOConfig's default recomputes them)")
    parser.add_argument("--micro-batch", type=int, default=8,
                        help="completions a forward and backward pass (per_device_train_batch_size); it must divide "
                             "the workload's prompts x samples")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    workload = WORKLOADS[args.workload]
    gpu = torch.cuda.is_available()
    completions = workload.prompts * workload.samples
    micro = min(args.micro_batch, completions)
    if completions % micro:
        raise SystemExit(f"--micro-batch {args.micro_batch} does not divide the workload's {completions} completions")
    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines()]
    timings = Timings()
    timings.install()
    steps_file = args.out / "trl_steps.jsonl"
    steps_file.unlink(missing_ok=True)

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *_, **__):
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            if gpu:
                torch.cuda.synchronize()
            phases = timings.take()
            row = {"time/total": time.perf_counter() - self.start,
                   "time/rollout": sum(v for k, v in phases.items() if "generate" in k),
                   "time/weight_sync": sum(v for k, v in phases.items() if "sync_weights" in k),
                   "trl/phases": phases}
            if gpu:
                row["memory/peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
                # vLLM's sleep mode allocates through a torch MemPool and, asleep, releases the pool's memory
                # behind torch's back: torch still counts it, so the peak above holds the sleeping engine's pool
                # (it passed the card at W2). bench_peers takes it off to give the trainer's own peak.
                from vllm.device_allocator.cumem import CuMemAllocator
                row["memory/engine_pool_gb"] = CuMemAllocator.get_instance().get_current_usage() / 2**30
            with open(steps_file, "a") as f:
                f.write(json.dumps(row) + "\n")

    config = GRPOConfig(
        output_dir=str(args.out / "trl_run"), max_steps=workload.steps, learning_rate=1e-6, beta=0.0,
        num_generations=workload.samples, per_device_train_batch_size=micro,
        gradient_accumulation_steps=completions // micro, num_iterations=1, temperature=1.0,
        max_completion_length=workload.response_tokens, bf16=gpu, logging_steps=1, report_to="none",
        save_strategy="no", shuffle_dataset=False, use_vllm=gpu, vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.engine_memory, vllm_enable_sleep_mode=gpu,
        generation_kwargs={"ignore_eos": True} if gpu else {"min_new_tokens": workload.response_tokens},
        gradient_checkpointing=args.gradient_checkpointing, use_cpu=not gpu)
    trainer = GRPOTrainer(model=str(args.model_dir), reward_funcs=hash_reward, args=config,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts] * workload.steps),
                          callbacks=[StepTimes()])
    trainer.train()
    (args.out / "trl_settings.json").write_text(json.dumps(
        {"trl": __import__("trl").__version__, "loss_type": config.loss_type, "bf16_weights_and_adam": gpu,
         "gradient_checkpointing": config.gradient_checkpointing, "micro_batch": micro,
         "vllm_sleep_level": 2 if gpu else None, "generation": "vllm colocate" if gpu else "transformers",
         # whether TRL asked vLLM for each token's log-prob (as vime_ext does unless --no-rollout-log-probs)
         "vllm_importance_sampling_correction": getattr(config, "vllm_importance_sampling_correction", None)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
