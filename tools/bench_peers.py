"""One fixed GRPO workload, timed the same way for every framework that runs it, and one table.

    python tools/bench_peers.py --workload w1 --model-dir DIR --out OUT [--frameworks vime_ext]
    python tools/bench_peers.py --table --out OUT             # the table of the results already in OUT

A workload is fixed in everything that decides the work: the prompts (exactly ``prompt_tokens`` tokens each, the
same file for every framework), samples per prompt, responses of exactly ``response_tokens`` tokens
(``ignore_eos``), temperature 1, one optimizer step per rollout, bf16, no KL term, and a reward that costs nothing
but varies (a hash of the response, ``tools/bench_plugins.py``). W1: a Qwen3-0.6B-shaped model with random
weights (``tools/make_random_hf.py``), 32 prompts of 256 tokens x 8 samples of 1,024 tokens. W2: the Qwen3-4B
shape, 8 x 8 samples of 2,048 tokens. ``tiny``: a CPU smoke of the same path.

Per framework: median seconds per step over the timed steps (after ``warmup`` steps), trained tokens per second
per GPU (samples x (prompt + response) tokens / step seconds / GPUs), the phase split where the framework logs it,
and peak GPU memory. Each run writes ``OUT/<name>.result.json``; the table reads them all, and ``OUT/phases.png``
draws its rows as bars of their phases. A run stopped at ``--time-limit-s`` keeps the steps it logged: its row says
how many of the timed steps it reached.

Frameworks: ``vime_ext`` (``train.py``, colocated on one GPU, engine asleep while the trainer trains) and ``trl``
(``tools/bench_trl.py``: TRL's ``GRPOTrainer``, vLLM colocated in its process, asleep while it trains; needs
``trl`` importable) and ``verl`` (``tools/bench_verl.py``: verl 0.9.1's ``main_ppo``, FSDP with vLLM colocated,
from its own site, ``$VERL_SITE``). A framework named twice runs twice, the second row marked "again": list
``vime_ext`` after the peers too, to bound the machine's drift over the run. Every other row is one of these three
with flags of its own (``RUNNERS`` says why each exists); ``--list`` prints each row with its flags.
"""

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.sharing_table import HANDOVER  # noqa: E402

# Put first on the path of verl's processes: hides TRL (installed for the TRL row) from verl (see its docstring)
VERL_PATH = ROOT / "tools" / "verl_path"

PHASES = [("generate", ("time/rollout",)), ("log-probs", ("time/log_probs",)), ("train", ("time/train",)),
          ("weight sync", ("time/weight_sync",)), ("sleep/wake", HANDOVER)]


@dataclass(frozen=True)
class Workload:
    name: str
    shape: str  # tools/bench_train.py's SHAPES
    prompts: int
    prompt_tokens: int
    samples: int
    response_tokens: int
    warmup: int = 2
    timed: int = 5

    @property
    def steps(self) -> int:
        return self.warmup + self.timed

    @property
    def tokens_per_step(self) -> int:
        return self.prompts * self.samples * (self.prompt_tokens + self.response_tokens)


WORKLOADS = {
    "w1": Workload("w1", "qwen3-0.6b", 32, 256, 8, 1024),
    "w2": Workload("w2", "qwen3-4b", 8, 256, 8, 2048),
    "tiny": Workload("tiny", "tiny", 2, 16, 2, 8, warmup=1, timed=2),
}


def write_prompts(tokenizer, workload: Workload, path: Path, seed: int = 0) -> Path:
    """``workload.prompts`` prompts of exactly ``prompt_tokens`` tokens under ``tokenizer`` (plain text, no chat
    template: every framework tokenizes it as is), as prompt-data JSONL; each one checked after re-tokenizing."""
    import random

    rng = random.Random(seed)
    candidates = ("river", "stone", "light", "paper", "garden", "window", "music", "orange", "silver", "forest",
                  "market", "winter")
    words = [w for w in candidates if len(tokenizer(f" {w}", add_special_tokens=False)["input_ids"]) == 1]
    rows = []
    for i in range(workload.prompts):
        text = f"Prompt {i}:" + "".join(f" {rng.choice(words)}" for _ in range(workload.prompt_tokens))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:workload.prompt_tokens]
        text = tokenizer.decode(ids)
        count = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if count != workload.prompt_tokens:
            raise ValueError(f"prompt {i}: {count} tokens after re-tokenizing, not {workload.prompt_tokens}")
        rows.append({"prompt": text, "label": ""})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def vime_ext_command(workload: Workload, model_dir: Path, data: Path, out: Path, gpu: bool,
                     flags: tuple[str, ...] = ()) -> list[str]:
    """This project's run of the workload: colocated on one GPU (the engine asleep at level 2 while the trainer
    trains, with TRL's engine settings), one optimizer step per rollout, no KL, the bench's reward and ignore_eos
    generate; then ``flags``. With ``--async-training`` one rollout more than the workload's steps: the run's last
    step has no rollout to generate beside it, so it is left untimed (``ASYNC_EXTRA_STEPS``)."""
    samples = workload.prompts * workload.samples
    rollouts = workload.steps + (ASYNC_EXTRA_STEPS if "--async-training" in flags else 0)
    command = [sys.executable, "-m", "vime_ext.train", "--hf-checkpoint", str(model_dir), "--prompt-data", str(data),
               "--rollout-batch-size", str(workload.prompts), "--n-samples-per-prompt", str(workload.samples),
               "--rollout-max-response-len", str(workload.response_tokens), "--rollout-temperature", "1.0",
               "--global-batch-size", str(samples), "--num-rollout", str(rollouts),
               "--custom-generate-function-path", "tools.bench_plugins.generate",
               "--custom-rm-path", "tools.bench_plugins.reward", "--lr", "1e-6",
               "--tensorboard-dir", str(out / "vime_ext_tb")]
    if gpu:
        command += ["--colocate", "--bf16", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384",
                    *TRL_ENGINE_SETTINGS]
        if not any(f in flags for f in ("--async-training", "--no-offload-rollout")):  # engines that sleep
            command += ["--engine-sleep-level", "2"]  # as TRL's: the weights dropped, the push brings them back
    else:  # the CPU smoke: the transformers engine, in this process
        command += ["--engine-backend", "hf", "--no-ray"]
    return command + list(flags)


# vLLM settings where this project's engine defaults differ from the engine TRL 1.16 builds in its process
# (trl/generation/vllm_generation.py): prefill in chunks of 4,096 tokens, not the API server's 8,192. Both run the
# 256 sequences at once, with CUDA graphs, in the same memory share; TRL sleeps at level 2 (above).
TRL_ENGINE_SETTINGS = ("--vllm-max-num-batched-tokens", "4096")

# An asynchronous run's steps after the workload's: the last step trains on a rollout made during the one before
# and generates nothing beside it (5.8 s against 17-19 s on W1), so it is run but not timed.
ASYNC_EXTRA_STEPS = 1


# --time-limit-s's default: a peer that hangs must not take the machine's lease
TIME_LIMIT_S = 900.0


class StoppedAtLimit(RuntimeError):
    """A run stopped at the time limit; the steps it logged before that still make a row, marked as such."""

    def __init__(self, message: str, wall: float):
        super().__init__(message)
        self.wall = wall


def run_command(name: str, command: list[str], out: Path, time_limit_s: float, first_on_path: list[str] = (),
                env: dict[str, str] | None = None) -> float:
    """``command`` with its output in ``OUT/<name>.log``, ``first_on_path`` then the repository first on its
    module path, stopped with its whole process group after ``time_limit_s``; its wall seconds."""
    start = time.perf_counter()
    path = os.pathsep.join(filter(None, [*first_on_path, str(ROOT), os.environ.get("PYTHONPATH")]))
    with open(out / f"{name}.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                   env={**os.environ, **(env or {}), "PYTHONPATH": path})
        try:
            code = process.wait(timeout=time_limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its engines and workers with it
            process.wait()
            raise StoppedAtLimit(f"{name} ran past {time_limit_s:.0f} s and was stopped; its log: "
                                 f"{out / f'{name}.log'}", time.perf_counter() - start) from None
    if code:
        raise RuntimeError(f"{name} exited {code}; its log: {out / f'{name}.log'}")
    return time.perf_counter() - start


def measure(name: str, workload: Workload, run: Callable[[], float], read_steps: Callable[[], list[dict]]) -> dict:
    """The row of one framework's run: ``run()`` (its wall seconds), then its per-step metrics from
    ``read_steps()``. A run stopped at the time limit keeps the steps it logged (the row says how many); one that
    logged none, or failed, raises."""
    try:
        wall, stopped = run(), None
    except StoppedAtLimit as error:
        wall, stopped = error.wall, error
    try:
        steps = read_steps()
    except FileNotFoundError:
        if not stopped:
            raise
        steps = []  # stopped before its first step wrote the file
    if stopped and not steps:
        raise stopped
    return result(name, workload, steps, gpus=1, wall=wall, stopped=stopped is not None)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def vime_ext_steps(out: Path, name: str) -> list[dict]:
    return [r for r in jsonl(out / name / "vime_ext_tb" / "metrics.jsonl") if "time/total" in r]


def trl_steps(out: Path, name: str) -> list[dict]:
    return jsonl(out / name / "trl_steps.jsonl")


def verl_steps(out: Path, name: str) -> list[dict]:
    from tools import bench_verl

    return bench_verl.steps(out / name / "verl_metrics.jsonl")


def run_vime_ext(name: str, workload: Workload, model_dir: Path, data: Path, out: Path, engine_memory: float,
                 time_limit_s: float, flags: tuple[str, ...] = ()) -> dict:
    import torch

    gpu = torch.cuda.is_available()
    command = vime_ext_command(workload, model_dir, data, out / name, gpu, flags)
    if gpu:
        command += ["--vllm-gpu-memory-utilization", str(engine_memory)]
    # its engines' own logs beside its figures (what vLLM saw: its settings, cache size, throughput)
    return measure(name, workload,
                   lambda: run_command(name, command, out, time_limit_s,
                                       env={"VIME_EXT_LOG_DIR": str(out / name / "engines")}),
                   lambda: vime_ext_steps(out, name)[:workload.steps])


def run_trl(name: str, workload: Workload, model_dir: Path, data: Path, out: Path, engine_memory: float,
            time_limit_s: float, flags: tuple[str, ...] = ()) -> dict:
    (out / name).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "tools/bench_trl.py", "--workload", workload.name, "--model-dir", str(model_dir),
               "--prompts", str(data), "--out", str(out / name), "--engine-memory", str(engine_memory), *flags]
    return measure(name, workload, lambda: run_command(name, command, out, time_limit_s),
                   lambda: trl_steps(out, name))


def run_verl(name: str, workload: Workload, model_dir: Path, data: Path, out: Path, engine_memory: float,
             time_limit_s: float, bypass: bool = False) -> dict:
    from tools import bench_verl

    site = os.environ.get("VERL_SITE")
    if not site:
        raise RuntimeError("verl: $VERL_SITE is not set; install its set first (tools/gpu_wheels.py fetch/pack --verl, "
                           "then install and source /tmp/gpu_site/env.sh)")
    (out / name).mkdir(parents=True, exist_ok=True)
    parquet = bench_verl.write_parquet(data, out / name / "prompts.parquet")
    file_log = out / name / "verl_metrics.jsonl"  # verl_steps reads it
    file_log.unlink(missing_ok=True)
    command = [sys.executable, "-m", "verl.trainer.main_ppo",
               *bench_verl.overrides(workload, model_dir, parquet, out / name, engine_memory, bypass)]
    return measure(name, workload,
                   lambda: run_command(name, command, out, time_limit_s, first_on_path=[str(VERL_PATH), site],
                                       env={"VERL_FILE_LOGGER_PATH": str(file_log)}),
                   lambda: verl_steps(out, name))


def engines_per_gpu(n: int, *more: str) -> tuple[str, ...]:
    """This project's flags for ``n`` engines on the GPU, the requests handed out in turn (round robin), and
    ``more``: each engine gets its exact share, where the default consistent hash need not split W1's session keys
    evenly (148 to 108 between two engines, on the CPU) and the step waits for the busier one."""
    return ("--rollout-engines-per-gpu", str(n), "--router-policy", "round_robin", *more)


RUNNERS = {"vime_ext": run_vime_ext, "trl": run_trl, "verl": run_verl,
           # TRL without GRPOConfig's default gradient checkpointing: its fastest training where memory allows
           "trl_no_checkpointing": functools.partial(run_trl, flags=("--no-gradient-checkpointing",)),
           # and with passes of 16 completions, not 8 (W1: 20,480 tokens a pass, this project's 16,384); of 2 and
           # 4 at W2, where 8 would not fit: about 4.7 MB of activations a token (records/peers_w2_h200_run3), so
           # 18,432 tokens' 87 GB beside TRL's 32 GB of bf16 weights, gradients and Adam states and the engine's
           # 0.3 share (42 GiB); 4,608 tokens (as vime_ext_resident_mb4608) should fit, 9,216 may
           **{f"trl_no_checkpointing_mb{n}": functools.partial(
               run_trl, flags=("--no-gradient-checkpointing", "--micro-batch", str(n))) for n in (2, 4, 16)},
           # verl without its separate old-log-prob pass (bench_verl.BYPASS), as this project's trainer skips it
           "verl_bypass": functools.partial(run_verl, bypass=True),
           # the engines answer token ids only (no --use-tis, no trainer-vs-engine metrics; TRL's runner records
           # whether TRL asked vLLM for log-probs)
           "vime_ext_no_log_probs": functools.partial(run_vime_ext, flags=("--no-rollout-log-probs",)),
           # four API-server processes share the engine's answers (docs/reference.md, Rollout engines)
           "vime_ext_4_api_servers": functools.partial(run_vime_ext, flags=("--vllm-api-server-count", "4")),
           # whole replies, each sent when it is done, not in pieces as the engine generates it (docs/reference.md,
           # Rollout engines)
           "vime_ext_whole": functools.partial(run_vime_ext, flags=("--rollout-stream-interval", "0")),
           # trainer and engine resident side by side: no hand-over between steps
           "vime_ext_resident": functools.partial(run_vime_ext, flags=("--no-offload-train", "--no-offload-rollout")),
           # the same at W2 (the 4B shape), in micro-batches of two 2,304-token sequences: the trainer's 60 GiB of
           # weights, gradients and optimizer state and the activations of 4,608 tokens (about 22 GiB at 4.7 MB a
           # token, records/peers_w2_h200_run3) beside an engine share of 0.3 (42 GiB, its KV cache room for all
           # 64 sequences) fit an H200, so no hand-over at all: 2.9 s of a W2 step (1.98 s of hand-over and the
           # state's 0.89 s back from the host) against smaller training passes. It ran in 23.21 s a step against
           # 25.88 with the hand-over, training 8.43 s against 9.12 (records/peers_w2_h200_run4, run3)
           "vime_ext_resident_mb4608": functools.partial(
               run_vime_ext, flags=("--no-offload-train", "--no-offload-rollout", "--max-tokens-per-gpu", "4608")),
           # the hand-over without the optimizers' state: it stays on the GPU while the engine generates
           "vime_ext_state_resident": functools.partial(run_vime_ext, flags=("--no-offload-optimizer-state",)),
           # the same with micro-batches of half the tokens: at W2 the state (45 GiB) beside the activations of
           # 16,384 tokens (at least 73 GiB) and the weights and gradients (15 GiB) is more than an H200 holds
           # (records/peers_w2_h200x2_run1: out of memory at 133 GiB allocated)
           "vime_ext_state_resident_mb8k": functools.partial(
               run_vime_ext, flags=("--no-offload-optimizer-state", "--max-tokens-per-gpu", "8192")),
           # micro-batches of twice the tokens: at the 0.6B shape small passes wait on megatron-core's per-layer
           # Python work, not the GPU (records/performance_log.md, runs H: 72 ms a 4,096-token pass for 31 ms of
           # kernels); whether W1's 16,384-token passes still do is what this row measures. 32,768 tokens trained
           # in 76.7 GiB on one GPU with nothing else on it (the same log, the largest micro-batch that fits)
           "vime_ext_mb32k": functools.partial(run_vime_ext, flags=("--max-tokens-per-gpu", "32768")),
           # two engines on the GPU, each with half the engines' memory share: W1's decode step is bound by the
           # engine's CPU work per sequence (records/peers_w1_h200_run5/generate_path: the device busy 39% of a
           # profiled step), which two engine processes split. Three and four engines: whether the split keeps
           # paying (records/peers_w1_h200_run6: two cut generation from 12.5 to 11.4 s a step, three took 13.8)
           **{f"vime_ext_{n}_engines": functools.partial(run_vime_ext, flags=engines_per_gpu(n)) for n in (2, 3, 4)},
           # two engines, trainer and engines resident side by side (no hand-over, on-policy as the others): at W1
           # the engines' share (70 GB) and the trainer's peak with its state (45 GB) fit an H200 together
           "vime_ext_2_engines_resident": functools.partial(
               run_vime_ext, flags=engines_per_gpu(2, "--no-offload-train", "--no-offload-rollout")),
           # two engines, the optimizers' state kept on the GPU: at W1 the state (7 GB) beside the trainer's peak
           # (38 GiB) and the engines' share (70 GB) fits an H200, so the hand-over need not move it
           "vime_ext_2_engines_state_resident": functools.partial(
               run_vime_ext, flags=engines_per_gpu(2, "--no-offload-optimizer-state")),
           # the same at W2 (the 4B shape), in micro-batches of 8,192 tokens as vime_ext_state_resident_mb8k: the
           # state (45 GiB) then makes no trip to the host and back (2.8 s a W2 step, records/peers_w2_h200x2_run2)
           # and beside two engines' share (70 GB) it fits while they generate. Its one run (2026-12-02) kept a
           # copy of the weights per push, the IPC leak since fixed, and stopped at step 2; its two engines took
           # 24 s to generate where one takes 14.4 (records/peers_w2_h200_run3)
           "vime_ext_2_engines_state_resident_mb8k": functools.partial(
               run_vime_ext, flags=engines_per_gpu(2, "--no-offload-optimizer-state", "--max-tokens-per-gpu", "8192")),
           # two engines, answering token ids only: each engine's API server then builds no log-prob entry per
           # token (on the CPU half its work a token), the part of the decode that two API servers already split
           "vime_ext_2_engines_no_log_probs": functools.partial(
               run_vime_ext, flags=engines_per_gpu(2, "--no-rollout-log-probs")),
           # the log-prob and entropy arithmetic over the vocabulary eager, as before it was compiled
           # (vime_ext/trainer/log_probs.py): what the compiled kernels save a step
           "vime_ext_eager_log_probs": functools.partial(run_vime_ext, flags=("--no-compile-log-probs",)),
           # vLLM without prefix caching: its scheduler then hashes and caches no full blocks, a part of the
           # per-sequence work each decode step waits on (W1's prompts are shared by 8 samples, 256 tokens each)
           "vime_ext_no_prefix_caching": functools.partial(run_vime_ext, flags=("--vllm-no-enable-prefix-caching",)),
           # one step off-policy (--max-staleness 1): rollout n + 1 generates while step n trains, engine and trainer
           # resident side by side; another algorithm than the others' on-policy steps, so a row of its own
           "vime_ext_async": functools.partial(run_vime_ext, flags=("--async-training", "--max-staleness", "1"))}


def base_runner(framework: str) -> Callable:
    """The run function behind a row (a RUNNERS name, or NAME_again): run_vime_ext, run_trl or run_verl, whatever
    flags the row gives it."""
    runner = RUNNERS[framework.removesuffix("_again")]
    return getattr(runner, "func", runner)


def step_reader(framework: str) -> Callable[[Path, str], list[dict]]:
    """Where a framework's run (a RUNNERS name, or NAME_again) logs its steps: its reader of ``OUT/<name>``."""
    return {run_vime_ext: vime_ext_steps, run_trl: trl_steps, run_verl: verl_steps}[base_runner(framework)]


def cut_off_rows(out: Path, workload: Workload, have: set[str]) -> list[dict]:
    """Rows of the runs in ``out`` that logged steps but wrote no result (a lease that ended mid-run, a killed
    bench): each from its metrics file, as ``measure`` would have made it, marked as cut off."""
    rows = []
    for folder in sorted(p for p in out.iterdir() if p.is_dir() and p.name not in have):
        if folder.name.removesuffix("_again") not in RUNNERS:
            continue
        try:
            steps = step_reader(folder.name)(out, folder.name)[:workload.steps]
        except FileNotFoundError:
            continue
        if steps:
            rows.append({**result(folder.name, workload, steps, gpus=1, wall=float("nan"), stopped=True),
                         "stopped_at_limit": False, "cut_off": True})
    return rows


def result(framework: str, workload: Workload, steps: list[dict], gpus: int, wall: float,
           stopped: bool = False) -> dict:
    """A framework's figures from its per-step metrics (``time/*`` seconds, ``memory/*`` GiB), the warm-up left
    out. A run ``stopped`` at the time limit may have logged fewer steps: its figures come from the timed steps it
    reached, or, where it reached none, from its last warm-up step (``timed_steps`` 0)."""
    if len(steps) != workload.steps and not (stopped and 0 < len(steps) < workload.steps):
        raise ValueError(f"{framework}: {len(steps)} steps logged, the workload has {workload.steps}")
    timed = steps[workload.warmup:] or steps[-1:]
    step_s = statistics.median(s["time/total"] - s.get("time/save", 0.0) for s in timed)
    # A phase the framework does not time apart is left out (None), not shown as 0
    phases = {name: statistics.median(sum(s.get(k, 0.0) for k in keys) for s in timed)
              if any(k in s for s in timed for k in keys) else None for name, keys in PHASES}
    # The trainer's own peak: less the engine's pool where the framework's count holds it (TRL's one process)
    peak = max((v - s.get("memory/engine_pool_gb", 0.0) for s in timed for k, v in s.items()
                if k.startswith("memory/") and k.endswith("peak_allocated_gb")), default=None)
    return {"framework": framework, "workload": asdict(workload), "gpus": gpus, "step_s": step_s,
            "tokens_per_s_per_gpu": workload.tokens_per_step / step_s / gpus, "phases": phases,
            "peak_gpu_gb": peak, "wall_s": wall, "steps_logged": len(steps),
            "timed_steps": len(steps[workload.warmup:]), "stopped_at_limit": stopped}


def failure(framework: str, error: Exception) -> dict:
    """The row of a framework that did not finish the workload: why, in one line (the log holds the rest)."""
    return {"framework": framework, "failed": f"{type(error).__name__}: {error}".splitlines()[0]}


def name_cell(row: dict) -> str:
    """The framework's name; for a run stopped at the time limit or cut off before its result, how far it got."""
    if not (row.get("stopped_at_limit") or row.get("cut_off")):
        return row["framework"]
    timed, warmup = row["timed_steps"], row["workload"]["warmup"]
    reached = (f"{timed} of {row['workload']['timed']} timed steps" if timed
               else f"no timed step; warm-up step {row['steps_logged']} of {warmup}")
    why = "cut off before its result, from its metrics file" if row.get("cut_off") else "stopped at the time limit"
    return f"{row['framework']} ({why}: {reached})"


def table(results: list[dict]) -> str:
    """One row per framework; the last column is the row's tokens/s/GPU over the fastest TRL row's (the issue's goal
    is a multiple of TRL's; blank without a TRL row). A framework that did not finish gets a row that says why."""
    trl = max((r for r in results if r["framework"].startswith("trl") and "failed" not in r),
              key=lambda r: r["tokens_per_s_per_gpu"], default=None)
    cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["| framework | step s | tokens/s/GPU | " + " | ".join(f"{n} s" for n, _ in PHASES)
             + " | peak GiB | fastest TRL = 1 |", "|---" * (len(PHASES) + 5) + "|"]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['framework']} | did not finish: {r['failed']} |" + " |" * (len(PHASES) + 3))
            continue
        ratio = f"{r['tokens_per_s_per_gpu'] / trl['tokens_per_s_per_gpu']:.2f}x" if trl else ""
        peak = "" if r["peak_gpu_gb"] is None else f"{r['peak_gpu_gb']:.1f}"
        lines.append(f"| {name_cell(r)} | {r['step_s']:.2f} | {r['tokens_per_s_per_gpu']:,.0f} | "
                     + " | ".join(cell(r["phases"][n]) for n, _ in PHASES) + f" | {peak} | {ratio} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """A bar a framework: its median step split into the phases it times apart; what it does not time apart (TRL's
    log-probs and training, any framework's own work between phases) is the bar's grey rest. A framework whose
    phases overlap (``--async-training``: generation beside training, a push waiting for the rollout in flight)
    gets a thin bar per phase from 0 and a black mark at its step instead. Frameworks that did not finish are left
    out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if "failed" not in r]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.6))
    colors = dict(zip([n for n, _ in PHASES], plt.get_cmap("tab10").colors))
    labelled = set()

    def bar(y, width, left, color, label, height=0.8):
        ax.barh(y, width, left=left, height=height, color=color, label=None if label in labelled else label)
        labelled.add(label)

    for y, r in enumerate(reversed(rows)):
        timed = [(name, r["phases"][name] or 0.0) for name, _ in PHASES]
        if sum(seconds for _, seconds in timed) > 1.05 * r["step_s"]:  # overlapping phases: side by side
            height = 0.8 / len(timed)
            for i, (name, seconds) in enumerate(timed):
                bar(y + 0.4 - height * (i + 0.5), seconds, 0.0, colors[name], name, height)
            ax.plot([r["step_s"]] * 2, [y - 0.45, y + 0.45], color="black", linewidth=2)
        else:
            left = 0.0
            for name, seconds in timed:
                bar(y, seconds, left, colors[name], name)
                left += seconds
            bar(y, max(r["step_s"] - left, 0.0), left, "lightgrey", "not timed apart")
        ax.text(r["step_s"], y, f" {r['step_s']:.1f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r["framework"] for r in reversed(rows)])
    workload = rows[0]["workload"]
    ax.set_xlabel(f"seconds a step (median of {workload['timed']} after {workload['warmup']} warm-up), "
                  f"workload {workload['name']}")
    ax.set_xlim(0, max(r["step_s"] for r in rows) * 1.15)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(PHASES) + 1, fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def row_flags(name: str) -> str:
    """A bench row as its framework and the flags it adds, for ``--list``."""
    keywords = getattr(RUNNERS[name], "keywords", {})
    extra = list(keywords.get("flags", ())) + (["(bypass mode)"] if keywords.get("bypass") else [])
    return " ".join([base_runner(name).__name__.removeprefix("run_"), *extra])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="w1")
    parser.add_argument("--model-dir", type=Path, help="an HF checkpoint of the workload's shape")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--list", action="store_true", help="print every row --frameworks takes, with its flags")
    parser.add_argument("--frameworks", nargs="+", default=["vime_ext"], choices=sorted(RUNNERS),
                        help="run in this order; a name given twice runs twice (its second row: NAME_again)")
    parser.add_argument("--engine-memory", type=float, default=0.5, help="vLLM's share of the GPU, for every one")
    parser.add_argument("--time-limit-s", type=float, default=TIME_LIMIT_S,
                        help="seconds a framework's run may take before it is stopped and its row says so")
    parser.add_argument("--table", action="store_true",
                        help="only print the table of the results in --out, with rows made from the metrics of runs "
                             "that were cut off before writing theirs (of --workload), and draw them (phases.png)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(f"{name}: {row_flags(name)}" for name in RUNNERS))
        return 0
    if args.out is None:
        parser.error("--out is needed (the folder of the results)")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    if not args.table:
        if args.model_dir is None:
            parser.error("--model-dir is needed to run (python tools/make_random_hf.py --shape SHAPE --out DIR)")
        from transformers import AutoTokenizer

        workload = WORKLOADS[args.workload]
        data = write_prompts(AutoTokenizer.from_pretrained(args.model_dir), workload, args.out / "prompts.jsonl")
        seen = set()
        for framework in args.frameworks:
            name = f"{framework}_again" if framework in seen else framework
            seen.add(framework)
            print(f"{time.strftime('%H:%M:%S')} {name}: running (log: {args.out / f'{name}.log'})", flush=True)
            try:  # a peer that fails leaves its row and the others run
                figures = RUNNERS[framework](name, workload, args.model_dir, data, args.out, args.engine_memory,
                                             args.time_limit_s)
            except Exception as error:  # noqa: BLE001 - any failure of one framework is its row's content
                figures = failure(name, error)
                failed.append(name)
            print(f"{time.strftime('%H:%M:%S')} {name}: {figures.get('failed', 'done')}", flush=True)
            (args.out / f"{name}.result.json").write_text(json.dumps(figures, indent=1))
    results = [json.loads(p.read_text()) for p in sorted(args.out.glob("*.result.json"))]
    if args.table:
        results += cut_off_rows(args.out, WORKLOADS[args.workload], {r["framework"] for r in results})
    print(table(results))
    plot(results, args.out / "phases.png")  # the same rows, as bars of their phases
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
