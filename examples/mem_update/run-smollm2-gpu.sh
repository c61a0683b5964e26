#!/usr/bin/env bash
# MemUpdate learned by SmolLM2-135M-Instruct on GPUs: a supervised warm start from demonstrations of good
# episodes (Qwen <tool_call> sequences played on the real store and tools), then GRPO with the example's reward
# through this example's Qwen3-4B launch script (its variables scaled to the small model), then QA before and
# after the agent's edits on held-out conversations, scored by a fixed reader (the base SmolLM2, an engine of
# its own) for every model. Stages:
#   bash examples/mem_update/run-smollm2-gpu.sh prepare       # conversations, the split, SFT chats
#   SEED=0 bash examples/mem_update/run-smollm2-gpu.sh seed   # on one GPU: SFT, GRPO from it, both evaluated
#   bash examples/mem_update/run-smollm2-gpu.sh base          # the base model evaluated
#   bash examples/mem_update/run-smollm2-gpu.sh table         # base / SFT / SFT + RL over the seeds: .md .json
#   SEEDS="0 1" bash examples/mem_update/run-smollm2-gpu.sh all   # prepare, a seed per GPU at once, base, table
# Everything goes under VIME_EXT_OUT (default runs/mem_update_smollm2): data/, seed_S/{sft,rl}, eval/ (one
# SAVE_FILE per model: base, sft_sS, rl_sS; resumable), table/. Extra arguments go to the GRPO run's train.py.
# The training reward's scorer is the settings' (MEMUP_SCORER, default proxy); the evaluation's is the reader.
set -euo pipefail
source "$(dirname "$0")/common.sh"
STAGE=${1:?usage: run-smollm2-gpu.sh prepare|seed|base|table|all [train.py flags for the GRPO run]}
shift

WORK=${VIME_EXT_OUT:-runs/mem_update_smollm2}
DATA_ROOT=${DATA_ROOT:-${WORK}/data}
RESULTS=${RESULTS:-${WORK}/eval}
SEED=${SEED:-0} SEEDS=${SEEDS:-"0 1 2"}
CONVERSATIONS=${CONVERSATIONS:-40} N_TEST=${N_TEST:-10} EVAL_NUM=${EVAL_NUM:-64}
SFT_EPOCHS=${SFT_EPOCHS:-2} SFT_LR=${SFT_LR:-2e-5}
RL_ROLLOUTS=${RL_ROLLOUTS:-30} RL_LR=${RL_LR:-1e-5}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-16} N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8}
TURN_TOKENS=${TURN_TOKENS:-256} MAX_MODEL_LEN=${MAX_MODEL_LEN:-8192}  # SmolLM2's context: an episode's bound
if [ -z "${HF_CKPT:-}" ]; then
  HF_CKPT=$(python -c "from vime_ext.models.packaged import smollm2_hf_dir; print(smollm2_hf_dir())" | tail -1)
fi
need "${HF_CKPT}/config.json" HF_CKPT
export HF_CKPT

prepare() {
  python -m examples.mem_update.prepare_data --generate --num-conversations "${CONVERSATIONS}" --n-test "${N_TEST}" \
    --seed 42 --out-dir "${DATA_ROOT}"
  # EVAL_NUM held-out questions drawn across the test conversations, the same for every model
  python -c 'import random, sys; lines = open(sys.argv[1]).readlines(); n = min(int(sys.argv[3]), len(lines))
open(sys.argv[2], "w").writelines(sorted(random.Random(0).sample(lines, n), key=lines.index))' \
    "${DATA_ROOT}/test.jsonl" "${DATA_ROOT}/test_eval.jsonl" "${EVAL_NUM}"
  python -m examples.mem_update.demonstrations --locomo "${DATA_ROOT}/locomo_generated.json" \
    --out "${DATA_ROOT}/sft.jsonl" --retriever "${MEMUP_RETRIEVER:-embedding}" --n-test "${N_TEST}" --seed 42
}

# rl SEED ARGS...: GRPO from the SFT save through the Qwen3-4B launch script, colocated on this GPU
rl() {
  local seed=$1
  shift
  HF_CKPT=${HF_CKPT} TORCH_DIST=${WORK}/seed_${seed}/sft MODEL_ARGS_SCRIPT="" COLOCATE=1 ACTOR_GPUS=1 \
    OPTIMIZER_OFFLOAD=0 TRAIN_DATA=${DATA_ROOT}/train.jsonl SAVE_PATH=${WORK}/seed_${seed}/rl \
    NUM_ROLLOUT=${RL_ROLLOUTS} ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE} N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT} \
    GLOBAL_BATCH_SIZE=$(( ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT )) SAVE_INTERVAL=${RL_ROLLOUTS} SAVE_OPTIM=0 \
    ENGINE_MEMORY=${ENGINE_MEMORY:-0.5} TURN_TOKENS=${TURN_TOKENS} RAY_PORT=$(( 6390 + seed )) \
    bash "${MEM_UPDATE_DIR}/run-qwen3-4b-train.sh" --lr "${RL_LR}" --seed "${seed}" \
    --engine-max-model-len "${MAX_MODEL_LEN}" --max-tokens-per-gpu 32768 --recompute-granularity selective "$@"
}

# evaluate SAVE_FILE [SAVE_PATH]: the held-out episodes of the base model or (with a save) its last iteration
evaluate() {
  local convert=0
  if [ -n "${2:-}" ]; then convert=1; fi
  CONVERT=${convert} SAVE_PATH=${2:-} MODEL_PATH=${HF_CKPT} SAVE_FILE=$1 TEST_DATA=${DATA_ROOT}/test_eval.jsonl \
    RESULTS=${RESULTS} bash "${MEM_UPDATE_DIR}/run-eval.sh" --reader-model "${HF_CKPT}" \
    --max-response-len "${TURN_TOKENS}" --max-model-len "${MAX_MODEL_LEN}" \
    --vllm-gpu-memory-utilization "${EVAL_ENGINE_MEMORY:-0.3}"
}

# seed SEED ARGS...: SFT, GRPO from it, then both evaluated at once (an engine and a reader each)
one_seed() {
  local seed=$1 pids=() status=0
  shift
  sft_warm_start "${HF_CKPT}" "${DATA_ROOT}/sft.jsonl" "${WORK}/seed_${seed}/sft" "${seed}" "${SFT_LR}" \
    "${SFT_EPOCHS}" --sft-max-len "${MAX_MODEL_LEN}" --sft-overlong skip
  rl "${seed}" "$@"
  evaluate "sft_s${seed}" "${WORK}/seed_${seed}/sft" & pids+=($!)
  evaluate "rl_s${seed}" "${WORK}/seed_${seed}/rl" & pids+=($!)
  for pid in "${pids[@]}"; do wait "${pid}" || status=1; done
  return "${status}"
}

table() {
  python -m examples.mem_update.results_table --results "${RESULTS}" --model base=base --model "SFT=sft_s*" \
    --model "SFT + RL=rl_s*" --out "${WORK}/table/mem_update_smollm2"
}

mkdir -p "${WORK}"
case "${STAGE}" in
  prepare) prepare ;;
  seed) one_seed "${SEED}" "$@" ;;
  base) evaluate base ;;
  table) table ;;
  all)
    prepare
    seeds_on_gpus "$0" "${WORK}" "$@" || true
    CUDA_VISIBLE_DEVICES=$(cut -d, -f1 <<<"${CUDA_VISIBLE_DEVICES:-0}") evaluate base
    table ;;
  *) echo "usage: run-smollm2-gpu.sh prepare|seed|base|table|all" >&2; exit 2 ;;
esac
