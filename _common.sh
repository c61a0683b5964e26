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

# The examples' Qwen3-4B GRPO launch on one node: trainer and engines on GPUs of their own, the KL reference
# converted once, saves resumed. The calling script sets TRAIN_DATA, SAVE_PATH,
# ROLLOUT_BATCH_SIZE and GLOBAL_BATCH_SIZE; HF_CKPT, TORCH_DIST, NUM_ROLLOUT, N_SAMPLES_PER_PROMPT,
# SAVE_INTERVAL, ACTOR_GPUS, ROLLOUT_GPUS and TP default here. Arguments (the example's plug-ins and settings,
# then the user's) go to train.py after the recipe.
grpo_qwen3_4b_train() {
  HF_CKPT=${HF_CKPT:-/models/Qwen3-4B}
  TORCH_DIST=${TORCH_DIST:-${HF_CKPT%/}_torch_dist}
  NUM_ROLLOUT=${NUM_ROLLOUT:-100} N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8}
  SAVE_INTERVAL=${SAVE_INTERVAL:-50} ACTOR_GPUS=${ACTOR_GPUS:-4} ROLLOUT_GPUS=${ROLLOUT_GPUS:-4} TP=${TP:-2}
  need "${HF_CKPT}/config.json" HF_CKPT
  need "${TRAIN_DATA}" TRAIN_DATA
  ensure_torch_dist "${HF_CKPT}" "${TORCH_DIST}"
  source "${VIME_EXT_ROOT}/scripts/models/qwen3-4B.sh"
  start_ray
  python train.py "${MODEL_ARGS[@]}" \
    --hf-checkpoint "${HF_CKPT}" --ref-load "${TORCH_DIST}" --prompt-data "${TRAIN_DATA}" --rollout-shuffle \
    --actor-num-nodes 1 --actor-num-gpus-per-node "${ACTOR_GPUS}" --rollout-num-gpus "${ROLLOUT_GPUS}" \
    --tensor-model-parallel-size "${TP}" "${GRPO_RECIPE_ARGS[@]}" \
    --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}" \
    --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" --global-batch-size "${GLOBAL_BATCH_SIZE}" \
    --rollout-temperature 1.0 --save "${SAVE_PATH}" --save-interval "${SAVE_INTERVAL}" --load "${SAVE_PATH}" \
    --vllm-gpu-memory-utilization 0.8 "$@"
}
