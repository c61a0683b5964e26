"""The GPU launch scripts' train.py command lines, on a machine without GPUs: ``nvidia-smi`` and ``ray`` are
stand-ins that report four GPUs, and ``python train.py`` parses and checks its arguments with train.py's own
parser (as on a CUDA machine) and records them instead of training; every other python call (data generation,
the scaling table) is real."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NVIDIA_SMI = """#!/bin/bash
if [ "$1" = -L ]; then for ((i = 0; i < ${STAND_IN_GPUS:-4}; i++)); do echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; done
else echo "NVIDIA H200"; fi
"""
RAY = """#!/bin/bash
[ "$1" = status ] && exit 1 || exit 0
"""
# train.py records its arguments and, given --tensorboard-dir, writes a metrics.jsonl of two rollouts there, as
# a run would, for the scaling table to read.
PYTHON = """#!/bin/bash
if [ "$1" = train.py ]; then
  exec {python} -c 'import json, sys; from pathlib import Path
args = sys.argv[2:]
import vime_ext.arguments as flags
flags._cuda = lambda: True  # the machine these scripts are for
try:
    flags.parse_train_args(args)
except flags.ConfigError as err:
    sys.exit(f"train.py: {{err}}")
Path(sys.argv[1]).write_text(json.dumps(args))
if "--tensorboard-dir" in args:
    from tools.scaling_table import COLUMNS
    tb = Path(args[len(args) - 1 - args[::-1].index("--tensorboard-dir") + 1]); tb.mkdir(parents=True, exist_ok=True)
    tb.joinpath("metrics.jsonl").write_text("".join(json.dumps({{"step": i, **{{k: 2.0 + i for k, _ in COLUMNS}}}})
                                                    + "\\n" for i in range(2)))
' {record} "${{@:2}}"
fi
if [ "$1" = tools/convert_hf_to_torch_dist.py ]; then exit 3; fi  # the stand-in checkpoint has no weights
exec {python} "$@"
"""


def stand_ins(tmp_path: Path, record: Path) -> Path:
    """A folder with the stand-ins, for the front of PATH; train.py's arguments go to ``record``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("nvidia-smi", NVIDIA_SMI), ("ray", RAY),
                       ("python", PYTHON.format(python=sys.executable, record=record))):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_with_stand_ins(tmp_path: Path, script: str, env: dict[str, str], *args: str) -> tuple[list[str], str]:
    """Run ``script`` with the stand-ins first on PATH; returns train.py's arguments and the script's output."""
    record = tmp_path / "train_args.json"
    full = {**os.environ, **env, "PATH": f"{stand_ins(tmp_path, record)}{os.pathsep}{os.environ['PATH']}"}
    full.pop("PYTHONPATH", None)
    if "CUDA_VISIBLE_DEVICES" not in env:
        full.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run(["bash", str(ROOT / script), *args], env=full, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and record.is_file(), (done.stdout + done.stderr)[-3000:]
    return json.loads(record.read_text()), done.stdout


def last(args: list[str], flag: str) -> str:
    """The value of ``flag``'s last occurrence (the one train.py's parser keeps)."""
    return args[len(args) - 1 - args[::-1].index(flag) + 1]


def stand_in_checkpoints(model: Path, torch_dist: Path) -> None:
    """A Qwen3-4B config.json without weights and a torch_dist tracker file: the scripts skip making and
    converting them, and train.py's parser checks the model flags against the config."""
    from tools.bench_train import hf_config
    from tools.make_random_hf import QWEN3_EXTRAS

    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({**hf_config("qwen3-4b"), **QWEN3_EXTRAS}))
    torch_dist.mkdir()
    (torch_dist / "latest_checkpointed_iteration.txt").write_text("1")


def test_scaling_bench_splits_the_gpus_and_tabulates(tmp_path):
    run, model = tmp_path / "out" / "mem_agent_scaling_4gpu", tmp_path / "qwen3-4b-random"
    stand_in_checkpoints(model, tmp_path / "qwen3-4b-random_torch_dist")
    args, stdout = run_with_stand_ins(tmp_path, "tools/bench_mem_agent_scaling.sh",
                                      {"VIME_EXT_OUT": str(tmp_path / "out"), "MODEL_DIR": str(model), "NUM_ROLLOUT": "2"},
                                      "--seed", "3")
    assert [last(args, flag) for flag in ("--actor-num-gpus-per-node", "--rollout-num-gpus",
                                          "--tensor-model-parallel-size", "--num-rollout")] == ["2", "2", "2", "2"]
    assert "--save" not in args and "--save-interval" not in args  # no checkpoint: 14 bytes a parameter
    assert last(args, "--hf-checkpoint") == str(model) and args[-2:] == ["--seed", "3"]
    assert "examples.mem_agent.rollout.generate" in args and "--use-distributed-optimizer" in args
    assert json.loads((run / "run.json").read_text()) == {"gpus": 4, "actor_gpus": 2, "rollout_gpus": 2, "tp": 2,
                                                          "device": "NVIDIA H200"}
    assert len((run / "train.jsonl").read_text().splitlines()) == 64
    assert "| 4 | 2 (TP 2) / 2 | 3.0 (1.00x)" in stdout


def test_mem_update_qwen3_4b_recipe(tmp_path):
    stand_in_checkpoints(tmp_path / "qwen3-4b", tmp_path / "qwen3-4b_torch_dist")
    (tmp_path / "train.jsonl").write_text("")
    args, _ = run_with_stand_ins(tmp_path, "examples/mem_update/run-qwen3-4b-train.sh",
                                 {"HF_CKPT": str(tmp_path / "qwen3-4b"), "TRAIN_DATA": str(tmp_path / "train.jsonl"),
                                  "SAVE_PATH": str(tmp_path / "ckpt")})
    assert last(args, "--ref-load") == str(tmp_path / "qwen3-4b_torch_dist")
    assert (last(args, "--eps-clip-high"), last(args, "--rollout-max-response-len")) == ("0.28", "512")
    assert last(args, "--save") == last(args, "--load") == str(tmp_path / "ckpt")
    assert (last(args, "--rollout-batch-size"), last(args, "--global-batch-size")) == ("16", "128")
    assert any(a.startswith("examples.mem_update.") for a in args) and "--use-distributed-optimizer" in args


# GPUs on the machine, the variables set -> (trainer GPUs, engine GPUs or "colocated", TP, optimizer offload)
LAYOUTS = [(1, {}, ("1", "colocated", "1", True)),
           (2, {}, ("1", "1", "1", True)),
           (4, {}, ("2", "2", "1", False)),
           (8, {}, ("4", "4", "2", False)),
           (8, {"COLOCATE": "1"}, ("8", "colocated", "2", False)),
           (2, {"COLOCATE": "1", "OPTIMIZER_OFFLOAD": "0"}, ("2", "colocated", "1", False)),
           (8, {"ACTOR_NODES": "2", "ROLLOUT_GPUS": "8"}, ("4", "8", "2", False)),
           # CUDA_VISIBLE_DEVICES narrows the machine's 8 to the 2 named (nvidia-smi lists all 8)
           (8, {"CUDA_VISIBLE_DEVICES": "2,3"}, ("1", "1", "1", True))]


@pytest.mark.parametrize("gpus,variables,expected", LAYOUTS)
def test_the_layout_follows_the_gpu_count(gpus, variables, expected, tmp_path):
    stand_in_checkpoints(tmp_path / "qwen3-4b", tmp_path / "qwen3-4b_torch_dist")
    (tmp_path / "train.jsonl").write_text("")
    env = {"HF_CKPT": str(tmp_path / "qwen3-4b"), "TRAIN_DATA": str(tmp_path / "train.jsonl"),
           "SAVE_PATH": str(tmp_path / "ckpt"), "STAND_IN_GPUS": str(gpus), **variables}
    args, stdout = run_with_stand_ins(tmp_path, "examples/mem_agent/run-qwen3-4b-train.sh", env)
    actors, engines, tp, offload = expected
    assert last(args, "--actor-num-gpus-per-node") == actors and last(args, "--tensor-model-parallel-size") == tp
    assert last(args, "--actor-num-nodes") == variables.get("ACTOR_NODES", "1")
    if engines == "colocated":
        assert "--colocate" in args and "--rollout-num-gpus" not in args
    else:
        assert "--colocate" not in args and last(args, "--rollout-num-gpus") == engines
    assert ("--optimizer-cpu-offload" in args) == offload
    assert last(args, "--vllm-gpu-memory-utilization") == ("0.7" if engines == "colocated" else "0.8")
    assert "layout: " in stdout


def test_colocated_engines_take_no_gpus_of_their_own(tmp_path):
    stand_in_checkpoints(tmp_path / "qwen3-4b", tmp_path / "qwen3-4b_torch_dist")
    env = {**os.environ, "HF_CKPT": str(tmp_path / "qwen3-4b"), "TRAIN_DATA": str(tmp_path / "qwen3-4b/config.json"),
           "COLOCATE": "1", "ROLLOUT_GPUS": "2"}
    env["PATH"] = f"{stand_ins(tmp_path, tmp_path / 'train_args.json')}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", str(ROOT / "examples/mem_agent/run-qwen3-4b-train.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "ROLLOUT_GPUS=2 with COLOCATE=1" in done.stderr


def test_multi_gpu_parts_are_named_and_need_two_gpus(tmp_path):
    env = {**os.environ, "VIME_EXT_OUT": str(tmp_path / "out")}
    env["PATH"] = os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists())
    done = subprocess.run(["bash", str(ROOT / "tools/run_multi_gpu.sh"), "tests"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "needs 2 or more GPUs; found 0" in done.stderr
    env["PATH"] = f"{stand_ins(tmp_path, tmp_path / 'train_args.json')}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", str(ROOT / "tools/run_multi_gpu.sh"), "everything"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "usage: run_multi_gpu.sh tests|nccl|scaling|colocate" in done.stderr


@pytest.mark.parametrize("layout", ["resident", "split"])
def test_the_async_benchmark_runs_the_script_in_either_layout(layout, tmp_path):
    work = tmp_path / "work"
    stand_in_checkpoints(work / "qwen3-4b-random", work / "qwen3-4b-random_torch_dist")
    data = work / "mem_agent_data" / "hotpotqa_train_tail.jsonl"
    data.parent.mkdir(parents=True)
    data.write_text("")
    args, _ = run_with_stand_ins(tmp_path, "tools/gpu_recipe.sh",
                                 {"WORK": str(work), "ASYNC_LAYOUT": layout, "ASYNC_K": "1", "PARTIAL": "1",
                                  "STAND_IN_GPUS": "4"}, "async_bench")
    assert last(args, "--max-staleness") == "1" and "--async-training" in args and "--partial-rollout" in args
    assert last(args, "--prompt-data") == str(data) and last(args, "--num-rollout") == "6"
    assert "--save" not in args  # SAVE_INTERVAL=0: nothing saved, so the metrics' folder is named
    assert last(args, "--tensorboard-dir") == str(work / f"mem_agent_async{'_split' if layout == 'split' else ''}_k1"
                                                  / "tensorboard")
    assert last(args, "--actor-num-gpus-per-node") == "1"
    if layout == "split":
        assert "--colocate" not in args and last(args, "--rollout-num-gpus") == "1"
    else:
        assert "--colocate" in args and last(args, "--vllm-gpu-memory-utilization") == "0.3"
