#!/usr/bin/env bash
# MemUpdate GRPO on Qwen3-4B with LoCoMo (prepare it first: python -m examples.mem_update.prepare_data --locomo
# locomo10.json --out-dir $DATA_ROOT). Set the variables below; every one has a default. Extra arguments go to
# train.py.
#   HF_CKPT=/models/Qwen3-4B DATA_ROOT=/data/mem_update SAVE_PATH=/ckpt/mem_update \
#     bash examples/mem_update/run-qwen3-4b-train.sh
set -euo pipefail
source "$(dirname "$0")/common.sh"

DATA_ROOT=${DATA_ROOT:-/data/mem_update}
HF_CKPT=${HF_CKPT:-/models/Qwen3-4B}
TORCH_DIST=${TORCH_DIST:-${HF_CKPT%/}_torch_dist}
TRAIN_DATA=${TRAIN_DATA:-${DATA_ROOT}/train.jsonl}
SAVE_PATH=${SAVE_PATH:-/ckpt/mem_update_qwen3-4b}
NUM_ROLLOUT=${NUM_ROLLOUT:-100} ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-16}
N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8} GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-128}
TURN_TOKENS=${TURN_TOKENS:-512} SAVE_INTERVAL=${SAVE_INTERVAL:-50}
ACTOR_GPUS=${ACTOR_GPUS:-4} ROLLOUT_GPUS=${ROLLOUT_GPUS:-4} TP=${TP:-2}

need "${HF_CKPT}/config.json" HF_CKPT
need "${TRAIN_DATA}" TRAIN_DATA
need "${MEMUP_CONFIG}" MEMUP_CONFIG
ensure_torch_dist "${HF_CKPT}" "${TORCH_DIST}"
source scripts/models/qwen3-4B.sh
start_ray

python train.py "${MODEL_ARGS[@]}" "${MEMUP_PLUGIN_ARGS[@]}" \
  --hf-checkpoint "${HF_CKPT}" --ref-load "${TORCH_DIST}" --prompt-data "${TRAIN_DATA}" --rollout-shuffle \
  --actor-num-nodes 1 --actor-num-gpus-per-node "${ACTOR_GPUS}" --rollout-num-gpus "${ROLLOUT_GPUS}" \
  --tensor-model-parallel-size "${TP}" "${GRPO_RECIPE_ARGS[@]}" --eps-clip-high 0.28 \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}" \
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" --global-batch-size "${GLOBAL_BATCH_SIZE}" \
  --rollout-max-response-len "${TURN_TOKENS}" --rollout-temperature 1.0 \
  --save "${SAVE_PATH}" --save-interval "${SAVE_INTERVAL}" --load "${SAVE_PATH}" \
  --vllm-gpu-memory-utilization 0.8 "$@"
