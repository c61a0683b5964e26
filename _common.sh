#!/usr/bin/env bash
# Shared set-up for launch scripts: `source "$(dirname "$0")/../../_common.sh"` (adjust the depth).
# Sets paths and environment; `start_ray` brings up a local Ray head when a script needs one.

VIME_EXT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export VIME_EXT_ROOT
export PYTHONPATH="${VIME_EXT_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
# Nothing is fetched from a model hub at run time; models come from local directories or packages.
export HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
export VIME_EXT_CACHE="${VIME_EXT_CACHE:-${HOME}/.cache/vime_ext}"
# Keep NCCL away from NVLink multicast (it can take shared hosts' GPUs down); harmless elsewhere.
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
export TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  NUM_GPUS=$(nvidia-smi -L | wc -l)
else
  NUM_GPUS=0
fi
export NUM_GPUS

start_ray() {
  # A head node on this machine, with its GPUs; a no-op when one is already running here.
  if ray status >/dev/null 2>&1; then return 0; fi
  ray start --head --node-ip-address 127.0.0.1 --num-gpus "${NUM_GPUS}" --disable-usage-stats \
    --include-dashboard=false >/dev/null
}

stop_ray() {
  ray stop --force >/dev/null 2>&1 || true
}

need() {  # need PATH VARIABLE: stop at once, naming the variable, when an input is missing
  if [ ! -e "$1" ]; then
    echo "$(basename "$0"): ${2} = $1 does not exist" >&2
    exit 1
  fi
}

latest_iteration() {  # the iteration in a save directory's tracker file
  need "$1/latest_checkpointed_iteration.txt" "$2"
  printf 'iter_%07d' "$(cat "$1/latest_checkpointed_iteration.txt")"
}

ensure_torch_dist() {  # ensure_torch_dist HF_DIR TORCH_DIST_DIR: convert once (the KL reference) when missing
  if [ ! -f "$2/latest_checkpointed_iteration.txt" ]; then
    echo "TORCH_DIST $2 missing: converting $1 (the KL reference)"
    python tools/convert_hf_to_torch_dist.py --hf-checkpoint "$1" --save "$2" --dtype bfloat16
  fi
}

# vime's GRPO recipe for Qwen3-4B-class models on GPUs, shared by the examples' run-qwen3-4b-train.sh:
# low-variance KL 0.001 to the reference, clip 0.2 (the upper clip is each example's), constant lr 1e-6, bf16,
# full recompute, token-budget micro-batches; megatron-core's distributed optimizer (states sharded over the
# data-parallel ranks) with the gradient reduction overlapped and accumulated in fp32.
GRPO_RECIPE_ARGS=(--bf16 --recompute-granularity full --use-dynamic-batch-size --max-tokens-per-gpu 16384
  --use-kl-loss --kl-loss-coef 0.001 --kl-loss-type low_var_kl --eps-clip 0.2
  --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta2 0.98 --clip-grad 1.0
  --use-distributed-optimizer --overlap-grad-reduce --accumulate-allreduce-grads-in-fp32)
