#!/usr/bin/env bash
# MemAgent's own task learned by SmolLM2-135M-Instruct on GPUs: 2-hop questions (novel -> author -> birthplace)
# over documents of 4 chunks among distractors, the last \boxed{} of the final reply rewarded, a supervised warm
# start from demonstrations, then GRPO through this example's Qwen3-4B launch script (its variables scaled to the
# small model), then RULER-HQA-format evaluation from 8K to 1M tokens on names no training item has. Stages:
#   bash examples/mem_agent/run-smollm2-gpu.sh prepare       # training items, SFT chats, held-out eval files
#   SEED=0 bash examples/mem_agent/run-smollm2-gpu.sh seed   # on one GPU: SFT, GRPO from it, both evaluated
#   bash examples/mem_agent/run-smollm2-gpu.sh base          # the base model evaluated
#   bash examples/mem_agent/run-smollm2-gpu.sh ceiling       # per eval length, the share a reader that keeps only
#                                                            # what it has read can answer (CPU; the table's row)
#   bash examples/mem_agent/run-smollm2-gpu.sh table         # base / SFT / SFT + RL over the seeds: .md .json .png,
#                                                            # and what the memories held (memory_audit.md/.json)
#   SEEDS="0 1" bash examples/mem_agent/run-smollm2-gpu.sh all   # prepare, a seed per GPU, base and ceiling at
#                                                                # once, table (BASE_FROM=DIR: the base model's
#                                                                # rows copied from an earlier run's eval folder)
# Everything goes under VIME_EXT_OUT (default runs/mem_agent_smollm2): data/, seed_S/{sft,rl}, eval/ (one
# SAVE_FILE per model: base, sft_sS, rl_sS; resumable), table/. Extra arguments go to the GRPO run's train.py.
#
# Scaled to SmolLM2's 8K context (MemAgent trains Qwen2.5 with 5000-token chunks, a 1024-token memory and
# 32K-token items): chunks of 2048 tokens, a memory of at most 256 tokens, a final answer of 64; training items
# of 170 generated documents (about 8.1K tokens, 4 chunks). The demonstrations' memories keep what a reader that
# knows only what it has read keeps, within the memory (MEM_MAX_MEMORY less a margin for the end of the reply):
# the author is unknown until the novel's sentence is read; until then (DEMO_KEEP) nothing (relevant, the default)
# or the most recent writers' birthplaces (recent). The recent reader answers a few more items at 8K-33K (75.0
# against 68.8 of 32 at 8K, the same from 66K on), but a model taught it copied only a quarter to a third of its
# memory's sentences faithfully (twenty look-alike sentences per chunk); the relevant one asks for two copies.
set -euo pipefail
export MEM_CHUNK_TOKENS=${MEM_CHUNK_TOKENS:-2048} MEM_MAX_MEMORY=${MEM_MAX_MEMORY:-256}
export MEM_MAX_FINAL=${MEM_MAX_FINAL:-64} MEM_MAX_CHUNKS=${MEM_MAX_CHUNKS:-16}
export MEM_ANSWER_FORMAT=${MEM_ANSWER_FORMAT:-boxed} MEM_ANSWER_PREFIX=${MEM_ANSWER_PREFIX-}
source "$(dirname "$0")/common.sh"
STAGE=${1:?usage: run-smollm2-gpu.sh prepare|seed|base|ceiling|table|all [train.py flags for the GRPO run]}
shift

WORK=${VIME_EXT_OUT:-runs/mem_agent_smollm2}
DATA_ROOT=${DATA_ROOT:-${WORK}/data}
TRAIN_DOCS=${TRAIN_DOCS:-170} TRAIN_NUM=${TRAIN_NUM:-1024}
LENGTH=${LENGTH:-"170 340 680 1360 2720 5440 10880 21760"}  # about 8.1K to 1.1M tokens, doubling
EVAL_NUM=${EVAL_NUM:-32}
# The held-out items scored (EVAL_SPLIT): test, the report's, at every LENGTH; or val (to choose settings on:
# other items drawn the same way, at VAL_LENGTH, by default the training length), into eval_val/ and table_val/
VAL_LENGTH=${VAL_LENGTH:-${TRAIN_DOCS}}
eval_split
EVAL_DATA=${DATA_ROOT}/ruler_hqa${SPLIT_SUFFIX} EVAL_LENGTH=${LENGTH}
if [ "${EVAL_SPLIT}" = val ]; then EVAL_LENGTH=${VAL_LENGTH}; fi
EVAL_DIR=${EVAL_DIR:-${WORK}/eval${SPLIT_SUFFIX}} TABLE_DIR=${WORK}/table${SPLIT_SUFFIX}
# One epoch at 1e-4 (40 steps), a warm start that leaves GRPO room (4 x H200 sweep of 2026-11-27, seed 0, 8K
# sub-EM of 32 held-out items): from it, 14 GRPO rollouts took sub-EM from 9.4 to 40.6; from three epochs (56.2
# alone) GRPO's 12-15 rollouts moved it by -3.1 to +9.4, within what two SFT runs of one setting differ by.
# (One epoch at 2e-5 left the held-out loss at 0.34 per token and memories mostly made up; 1e-4 ends at 0.023.)
SFT_NUM=${SFT_NUM:-512} SFT_EPOCHS=${SFT_EPOCHS:-1} SFT_LR=${SFT_LR:-1e-4}
# The demonstrations' documents (default: the training items'). Long GRPO items want short demonstrations: one SFT
# pass over demonstrations of 680 documents (17 chunks; 89% of the chats carry the memory unchanged, 3% answer)
# taught a model to box 41% of its answers and to keep no answer (2 x H200 sweep of 2026-11-27: 0.0 sub-EM at 8K,
# against 9.4 from those of 170 documents).
SFT_DOCS=${SFT_DOCS:-${TRAIN_DOCS}}
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}  # a chat: the prompt, a 256-token memory, a 2048-token chunk, the reply
DEMO_MEMORY=$(( MEM_MAX_MEMORY - 8 )) DEMO_KEEP=${DEMO_KEEP:-relevant}
# 9 GRPO steps: the published three seeds' (4 x H200, 2026-11-27; records/mem_agent_log.md, sixth run)
smollm2_recipe_defaults 9

# prepare: make_data, unless DATA_ROOT holds data made with the same values of DATA_VARS, the variables it reads
# (prepare_once in _common.sh)
DATA_VARS="TRAIN_NUM TRAIN_DOCS LENGTH EVAL_NUM VAL_LENGTH HF_CKPT SFT_NUM SFT_DOCS MEM_CHUNK_TOKENS DEMO_MEMORY
DEMO_KEEP"
prepare() {
  # shellcheck disable=SC2086  # DATA_VARS is a list of names
  prepare_once make_data ${DATA_VARS}
}

make_data() {
  echo "$(date +%T) prepare: start"  # the time line of a lease (the fifth run could not place 4 minutes)
  python -m examples.mem_agent.prepare_data --generate --num "${TRAIN_NUM}" --num-docs "${TRAIN_DOCS}" --hops 2 \
    --entities train --seed 0 --out "${DATA_ROOT}/train.jsonl" --eval-dir "${DATA_ROOT}/ruler_hqa" \
    --eval-lengths ${LENGTH} --eval-entities heldout --eval-num "${EVAL_NUM}" \
    --val-dir "${DATA_ROOT}/ruler_hqa_val" --val-lengths ${VAL_LENGTH}
  python -m examples.mem_agent.demonstrations --tokenizer "${HF_CKPT}" --num "${SFT_NUM}" --num-docs "${SFT_DOCS}" \
    --chunk-tokens "${MEM_CHUNK_TOKENS}" --memory-tokens "${DEMO_MEMORY}" --keep "${DEMO_KEEP}" --entities train \
    --seed 1000 --out "${DATA_ROOT}/sft.jsonl"
  # The same demonstrations on held-out names: the SFT run's held-out loss.
  python -m examples.mem_agent.demonstrations --tokenizer "${HF_CKPT}" --num 32 --num-docs "${SFT_DOCS}" \
    --chunk-tokens "${MEM_CHUNK_TOKENS}" --memory-tokens "${DEMO_MEMORY}" --keep "${DEMO_KEEP}" --entities heldout \
    --seed 2000 --out "${DATA_ROOT}/sft_heldout.jsonl"
  echo "$(date +%T) prepare: done"
}

# sft SEED: the warm start (sft_warm_start in _common.sh), the held-out demonstrations' loss before and after
sft() {
  SFT_HELDOUT=${DATA_ROOT}/sft_heldout.jsonl sft_warm_start "${HF_CKPT}" "${DATA_ROOT}/sft.jsonl" \
    "${WORK}/seed_$1/sft" "$1" "${SFT_LR}" "${SFT_EPOCHS}"
}

# evaluate SAVE_FILE [SAVE_PATH]: every length at once, the base model or (with a save) its last iteration, in
# EVAL_ENGINE_MEMORY (0.3) of the GPU: beside a seed's GRPO run (0.3 for its engine) and, in `all`, the base
# model's evaluation (0.25), on an 80 GB GPU too
evaluate() {
  local convert=0
  if [ -n "${2:-}" ]; then convert=1; fi
  CONVERT=${convert} SAVE_PATH=${2:-} MODEL_PATH=${HF_CKPT} SAVE_FILE=$1 DATA_ROOT=${EVAL_DATA} \
    LENGTH=${EVAL_LENGTH} SAVE_DIR=${EVAL_DIR} N_PROC=${EVAL_NUM} LENGTHS_AT_ONCE=1 MAX_MODEL_LEN=${MAX_MODEL_LEN} \
    bash "${MEM_AGENT_DIR}/run-eval.sh" --vllm-gpu-memory-utilization "${EVAL_ENGINE_MEMORY:-0.3}" "${KV_ARGS[@]}"
}

# seed SEED ARGS...: SFT, then GRPO from it with the SFT model's evaluation beside it, then the RL model's
# (grpo_beside_sft_eval in _common.sh)
one_seed() {
  local seed=$1
  shift
  sft "${seed}"
  TRAIN_DATA=${DATA_ROOT}/train.jsonl grpo_beside_sft_eval evaluate "${WORK}" "${seed}" \
    "${MEM_AGENT_DIR}/run-qwen3-4b-train.sh" "$@"
}

# ceiling: both readers' shares (TABLE_DIR/ceiling_{recent,relevant}.json), a row each in the table
ceiling() {
  local keep
  mkdir -p "${TABLE_DIR}"
  for keep in recent relevant; do
    python -m examples.mem_agent.demonstrations --tokenizer "${HF_CKPT}" --chunk-tokens "${MEM_CHUNK_TOKENS}" \
      --memory-tokens "${DEMO_MEMORY}" --keep "${keep}" --ceiling "${EVAL_DATA}" \
      >"${TABLE_DIR}/ceiling_${keep}.json"
  done
}

table() {
  local extra=() file
  for file in "${TABLE_DIR}"/ceiling_*.json; do
    if [ -s "${file}" ]; then extra+=(--ceiling "${file}"); fi
  done
  # The cost table of COST_OF (default base) only where it has results, as for the rows
  if compgen -G "${EVAL_DIR}/*/${COST_OF:-base}.summary.json" >/dev/null; then extra+=(--cost-of "${COST_OF:-base}"); fi
  models_with_results "${EVAL_DIR}/*/%s.summary.json" base=base "SFT=sft_s*" "SFT + RL=rl_s*"
  python -m examples.mem_agent.length_table --save-dir "${EVAL_DIR}" "${MODEL_ARGS[@]}" \
    --train-length "${TRAIN_DOCS}" --out "${TABLE_DIR}/mem_agent_smollm2" "${extra[@]}"
  # What the memories hold (boxed replies, the answer kept, sentences copied from the document): where a 0 comes from
  python -m examples.mem_agent.memory_audit --save-dir "${EVAL_DIR}" --data-root "${EVAL_DATA}" \
    --out "${TABLE_DIR}/memory_audit.json" >"${TABLE_DIR}/memory_audit.md"
}

# copy_base DIR: the base model's rows and summaries of every length in DIR (an earlier run's eval folder)
copy_base() {
  local folder
  for folder in "$1"/ruler_hqa_*/; do
    mkdir -p "${EVAL_DIR}/$(basename "${folder}")"
    cp "${folder}"base.* "${EVAL_DIR}/$(basename "${folder}")/"
  done
}

# base_on GPU: the base model's evaluation in a smaller share of GPU, beside the seeds
base_on() {
  CUDA_VISIBLE_DEVICES=$1 EVAL_ENGINE_MEMORY=0.25 evaluate base
}

# all ARGS...: prepare, then one seed per GPU at once (logs in WORK/seed_S.log) and, on the GPU with the fewest
# seeds (the first where they divide evenly), the base model's evaluation (its longest length sets the time: it
# starts first; if it fails there, once more after the seeds: again_if_failed), then the table
everything() {
  local base_pid="" ceiling_pid base_gpu
  prepare
  base_gpu=$(lightest_gpu)
  if [ -n "${BASE_FROM:-}" ]; then  # the base model's rows from an earlier run's SAVE_DIR, on the same files
    copy_base "${BASE_FROM}"
  else
    base_on "${base_gpu}" >"${WORK}/base.log" 2>&1 &
    base_pid=$!
  fi
  ceiling >"${WORK}/ceiling.log" 2>&1 &
  ceiling_pid=$!
  local status=0
  seeds_on_gpus "$0" "${WORK}" "$@" || status=$?
  if [ -n "${base_pid}" ]; then
    again_if_failed "${base_pid}" "the base model's evaluation" "the seeds" "${WORK}/base.log" base_on "${base_gpu}" ||
      echo "the base model's evaluation failed again: ${WORK}/base.log" >&2
  fi
  wait "${ceiling_pid}" || echo "the ceiling failed: ${WORK}/ceiling.log" >&2
  table
  all_status "${status}"
}

mkdir -p "${WORK}"
case "${STAGE}" in
  prepare) prepare ;;
  seed) one_seed "${SEED}" "$@" ;;
  base) evaluate base ;;
  ceiling) ceiling ;;
  table) table ;;
  all) everything "$@" ;;
  *) echo "usage: run-smollm2-gpu.sh prepare|seed|base|ceiling|table|all" >&2; exit 2 ;;
esac
