#!/usr/bin/env bash
# MemAgent GRPO on Qwen3-4B: vime's recipe (KL low_var_kl 0.001, eps-clip 0.2/0.3, lr 1e-6 constant, TP 2, full
# recompute). Set the variables below; every one has a default. Extra arguments go to train.py.
#   HF_CKPT=/models/Qwen3-4B TRAIN_DATA=/data/hotpotqa_train.jsonl SAVE_PATH=/ckpt/mem_agent \
#     bash examples/mem_agent/run-qwen3-4b-train.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"

DATA_ROOT=${DATA_ROOT:-/data/mem_agent}
HF_CKPT=${HF_CKPT:-/models/Qwen3-4B}
TORCH_DIST=${TORCH_DIST:-${HF_CKPT%/}_torch_dist}
TRAIN_DATA=${TRAIN_DATA:-${DATA_ROOT}/hotpotqa_train.jsonl}
SAVE_PATH=${SAVE_PATH:-/ckpt/mem_agent_qwen3-4b}
NUM_ROLLOUT=${NUM_ROLLOUT:-100} ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-8}
N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8} GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-64}
SAVE_INTERVAL=${SAVE_INTERVAL:-50}
ACTOR_GPUS=${ACTOR_GPUS:-4} ROLLOUT_GPUS=${ROLLOUT_GPUS:-4} TP=${TP:-2}

need "${HF_CKPT}/config.json" HF_CKPT
need "${TRAIN_DATA}" TRAIN_DATA
need "${MEM_CONFIG}" MEM_CONFIG
ensure_torch_dist "${HF_CKPT}" "${TORCH_DIST}"
source scripts/models/qwen3-4B.sh
start_ray

python train.py "${MODEL_ARGS[@]}" "${MEM_PLUGIN_ARGS[@]}" "${ADVANTAGE_ARGS[@]}" \
  --hf-checkpoint "${HF_CKPT}" --ref-load "${TORCH_DIST}" --prompt-data "${TRAIN_DATA}" --rollout-shuffle \
  --actor-num-nodes 1 --actor-num-gpus-per-node "${ACTOR_GPUS}" --rollout-num-gpus "${ROLLOUT_GPUS}" \
  --tensor-model-parallel-size "${TP}" "${GRPO_RECIPE_ARGS[@]}" --eps-clip-high 0.3 \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}" \
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" --global-batch-size "${GLOBAL_BATCH_SIZE}" \
  --rollout-max-response-len "${MEM_MAX_MEMORY}" --rollout-temperature 1.0 \
  --save "${SAVE_PATH}" --save-interval "${SAVE_INTERVAL}" --load "${SAVE_PATH}" \
  --vllm-gpu-memory-utilization 0.8 "$@"
