"""Faults and bad input, one short CPU run each, and a table of what survived.

    python tools/fault_suite.py [--out runs/fault_suite] [--only engine_kill,router_kill]

Every run is ``python -m vime_ext.train`` as a user starts it: GRPO on the arithmetic task, the tiny random Llama
of the tests (SmolLM2's tokenizer), 4 rollouts of 2 prompts x 4 samples, the transformers engine with a rollout
seed, a save every 2 rollouts. The fault comes from ``tools/fault_plugins.py`` (the run's reward), once, in
rollout 1, at a known point. Since every sample has its own seed, a run that recovers without losing or
repeating anything ends with the same weights as the clean run, which the last column checks.

Columns: outcome (survived: exit 0 and every rollout trained; refused: exit 2 and the message; died: the last
line), rollouts with a training step, samples that trained nothing (dropped with their groups), restarts
(engine/router/trainer), wall seconds over the clean run's, and whether the final weights equal the clean run's
(to 1e-5, with the largest difference: a Ray trainer rank sums on one thread, the clean run's on two).
Needs the tests' helpers (a checkout, not an install); ``disk_full`` mounts a tmpfs (root).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROLLOUTS, SAMPLES = 4, 8


@dataclass
class Fault:
    name: str
    what: str
    flags: list[str] = field(default_factory=list)
    resume: bool = False  # the run is killed; a second run resumes it with --load


FAULTS = [
    Fault("clean", "no fault (the reference)"),
    Fault("engine_kill", "engine SIGKILL mid-rollout, 2 engines", ["--rollout-num-gpus", "2"]),
    Fault("engine_kill_colocated", "engine SIGKILL mid-rollout, --colocate (its only engine)", ["--colocate"]),
    Fault("engine_kill_during_push", "engine SIGKILL during the weight push"),
    Fault("router_kill", "router SIGKILL mid-rollout"),
    Fault("trainer_kill_mid_step", "trainer rank SIGKILL mid-step (Ray)", ["--ray"]),
    Fault("trainer_stop_mid_step", "trainer rank SIGSTOP mid-step: hung (Ray)", ["--ray", "--trainer-hang-timeout", "20"]),
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


def run(flags: list[str], log: Path, env: dict[str, str], timeout: float = 1800) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIME_EXT_LOG_DIR": str(log.parent / "engines"), **env}
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "vime_ext.train", *flags], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=ROOT)
        try:
            process.wait(timeout=timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return process.returncode, time.perf_counter() - start


def last_rows(tb: Path) -> dict[int, dict]:
    if not (tb / "metrics.jsonl").is_file():
        return {}
    rows = [json.loads(line) for line in (tb / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "rollout/reward_mean" in r}


def final_weights(save: Path):
    """The model's tensors of the last iteration, read without megatron."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    last = save / f"iter_{ROLLOUTS:07d}"
    if not last.is_dir():
        return None
    dcp_to_torch_save(str(last), str(save / "last.pt"))
    return {k: v for k, v in torch.load(save / "last.pt", weights_only=False).items()
            if isinstance(v, torch.Tensor) and not k.startswith("optimizer") and "_extra_state" not in k}


def last_line(log: Path) -> str:
    """The log's last line that is not a progress bar."""
    lines = [line for line in log.read_text(errors="replace").replace("\r", "\n").splitlines()
             if line.strip() and "%|" not in line]
    return lines[-1][:160] if lines else "(no output)"


def one(fault: Fault, model: Path, data: Path, bad_data: Path, out: Path) -> dict:
    folder = out / fault.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    save = folder / "save"
    mounted = False
    if fault.name == "disk_full":
        clean_iter = out / "clean" / "save" / "iter_0000002"
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
    env = {"VIME_FAULT": "" if fault.name in ("clean", "malformed_data", "disk_full") else
           fault.name.removesuffix("_colocated"), "VIME_FAULT_DIR": str(folder), "VIME_FAULT_SAVE": str(save)}
    try:
        code, seconds = run(flags, folder / "run.log", env)
        log = folder / "run.log"
        if fault.resume:
            code, more = run(flags + ["--load", str(save)], folder / "resume.log", {**env, "VIME_FAULT": ""})
            seconds += more
            log = folder / "resume.log"
        rows = last_rows(save / "tb")
        weights = final_weights(save) if code == 0 else None
    finally:
        if mounted:
            subprocess.run(["umount", str(save)], check=False)
    trained = [r for r in rows.values() if r.get("train/sequences", 0) > 0]
    said = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("train.py: ")]
    if code == 0 and len(rows) == ROLLOUTS:
        outcome = "survived"
    elif said:  # refused at start (exit 2) or stopped with one message (exit 1)
        outcome = f"{'refused' if code == 2 else 'stopped'}: {said[-1].removeprefix('train.py: ')}"
    else:
        outcome = f"died (exit {code}): {last_line(log)}"
    last = rows.get(ROLLOUTS - 1, {})
    return {"fault": fault.what, "outcome": outcome, "seconds": seconds, "weights": weights,
            "trained_rollouts": len(trained),
            "not_trained": sum(SAMPLES - r.get("train/sequences", 0) for r in rows.values()),
            "restarts": "/".join(str(int(last.get(k, 0))) for k in
                                 ("rollout/engine_restarts", "rollout/router_restarts", "train/restarts"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/fault_suite")
    parser.add_argument("--only", help="comma-separated fault names (the clean run always runs)")
    args = parser.parse_args()
    from tests.train.test_train_loop import tiny_model_dir
    from vime_ext.data.synthetic import write_jsonl

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
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
    print("\n| fault | outcome | rollouts trained | samples not trained | restarts (engine/router/trainer) | "
          "extra wall s | final weights = clean run |\n|---|---|---|---|---|---|---|")
    for r in results:
        if "seconds" not in r:
            print(f"| {r['fault']} | {r['outcome']} | | | | | |")
            continue
        same = ""
        if r["weights"] is not None and clean["weights"] is not None:
            diff = max((r["weights"][k] - clean["weights"][k]).abs().max().item() for k in clean["weights"])
            # Ray's trainer rank computes on one thread, the clean run's on two: sums round differently.
            same = f"yes ({diff:.1g})" if diff < 1e-5 else f"no (max |diff| {diff:.2g})"
        print(f"| {r['fault']} | {r['outcome']} | {r['trained_rollouts']} of {ROLLOUTS} | {r['not_trained']:g} | "
              f"{r['restarts']} | {r['seconds'] - clean['seconds']:+.0f} | {same} |")


if __name__ == "__main__":
    main()
