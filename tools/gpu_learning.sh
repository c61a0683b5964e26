#!/usr/bin/env bash
# Both examples' SmolLM2 learning recipes (run-smollm2-gpu.sh `all`) at once on one machine of 4 GPUs, as one
# background job (a device lease is 30 minutes): MemAgent's seeds (SEEDS, default "0 1 2") a GPU each on
# MEM_AGENT_GPUS (default 0,1,2), its base model's evaluation beside them; MemUpdate's seeds (MEM_UPDATE_SEEDS,
# default "0") on MEM_UPDATE_GPUS (default 3), its rows without training beside them (fixed KV caches) or after.
# MEM_AGENT_ENV / MEM_UPDATE_ENV hold one example's variables ("RL_ROLLOUTS=16 RL_LR=2e-5 RL_MINUTES=9": GRPO
# stops and saves after 9 minutes, so that the evaluation after it fits a 30-minute lease); variables set
# around this script reach both; EXAMPLES (default "mem_agent mem_update") picks the examples run. Two recipes on
# one GPU compete for it (a trainer's memory churn can spoil an engine's start): give each GPUs of its own.
# Everything goes under VIME_EXT_OUT (default runs/learning)/<example>:
#   bash tools/gpu_learning.sh run         # both at once; start/end lines in VIME_EXT_OUT/learning.log
#   bash tools/gpu_learning.sh sweep       # one example's knobs side by side, a variant a GPU (below)
#   bash tools/gpu_learning.sh data FILE   # before a lease, without a GPU: the sweep's data, FILE.tar.xz (below)
#   bash tools/gpu_learning.sh pack FILE   # what a person reads, no weights and no generated data: eval JSONL
#                                          # and summaries, tables, training metrics, logs, GRPO's first and
#                                          # last rollouts without token lists (not all it saved), the evaluations'
#                                          # reader replies (a later run reuses them); FILE.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${VIME_EXT_OUT:-runs/learning}
mkdir -p "${OUT_DIR}"

log() { echo "$(date +%T) $*" | tee -a "${OUT_DIR}/learning.log"; }

# recipe EXAMPLE GPUS SEEDS ENV: the example's `all` stage, logged to OUT_DIR/EXAMPLE.log
recipe() {
  local example=$1 gpus=$2 seeds=$3 status=0
  log "start ${example} (GPUs ${gpus}, seeds ${seeds}) ${4}"
  # shellcheck disable=SC2086  # ENV is a list of NAME=VALUE words
  env ${4} CUDA_VISIBLE_DEVICES="${gpus}" SEEDS="${seeds}" VIME_EXT_OUT="${OUT_DIR}/${example}" \
    bash "examples/${example}/run-smollm2-gpu.sh" all >"${OUT_DIR}/${example}.log" 2>&1 || status=$?
  log "end ${example}: exit ${status}"
  return "${status}"
}

run() {
  local pids=() status=0 pid
  if command -v nvidia-smi >/dev/null; then  # the machine, for the record beside the figures
    log "machine: $(nvidia-smi -L | wc -l) x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  fi
  local examples=" ${EXAMPLES:-mem_agent mem_update} "
  if [[ "${examples}" == *" mem_agent "* ]]; then
    recipe mem_agent "${MEM_AGENT_GPUS:-0,1,2}" "${SEEDS:-0 1 2}" "${MEM_AGENT_ENV:-}" & pids+=($!)
  fi
  if [[ "${examples}" == *" mem_update "* ]]; then
    recipe mem_update "${MEM_UPDATE_GPUS:-3}" "${MEM_UPDATE_SEEDS:-0}" "${MEM_UPDATE_ENV:-}" & pids+=($!)
  fi
  for pid in "${pids[@]}"; do wait "${pid}" || status=1; done
  log "done: exit ${status}"
  return "${status}"
}

# sweep: one example's seed SEED (0) once per variant, on the GPUs of SWEEP_GPUS (default 0,1,2,3) in turn, at most
# SWEEP_PER_GPU (1) a GPU (more: fixed KV caches, as SEEDS_PER_GPU), to learn which knob gives GRPO something to
# learn from. SWEEP_EXAMPLE: mem_agent (default) or mem_update. SWEEP_VARIANTS: variants separated by ";", each a
# list of NAME=VALUE words for run-smollm2-gpu.sh (an empty one is the recipe as it is), e.g.
#   SWEEP_VARIANTS="SFT_EPOCHS=1; RL_TEMPERATURE=1.3; N_SAMPLES_PER_PROMPT=16 ROLLOUT_BATCH_SIZE=8"
# The example's MEM_AGENT_ENV / MEM_UPDATE_ENV reaches every variant. The data is prepared once
# (OUT_DIR/sweep/data), but a variant that sets a variable of the data (sweep_settings) prepares its own (when
# every variant does, the shared data is not made). Variant i runs under OUT_DIR/sweep/v<i> with a Ray port of
# its own. Variants are evaluated on the validation items (EVAL_SPLIT=val; MemAgent's at SWEEP_LENGTH, 170
# documents, the training length, or a list of lengths), so that the test items are left for the one run with the
# setting chosen (MemAgent's test items are written at SWEEP_LENGTH alone: the longer ones take minutes to
# write). Then OUT_DIR/sweep/sweep.md/.json (tools/sweep_table.py): SFT and SFT + RL scores per variant and GRPO's
# signal (groups of one reward, |advantage|, entropy, KL); for MemUpdate also OUT_DIR/sweep/edit_audit.md/.json
# (examples/mem_update/edit_audit.py on each variant's evaluation episodes: which memory each policy updates).

# sweep_settings: for SWEEP_EXAMPLE, SWEEP_ENV (its variables for every run) and SWEEP_DATA_VARS (the variables of
# its data: the recipe's DATA_VARS, which its prepare reads, and for MemAgent MEM_MAX_MEMORY, from which the
# recipe makes DEMO_MEMORY)
sweep_settings() {
  local derived=""
  case "${SWEEP_EXAMPLE:=mem_agent}" in
    mem_agent) SWEEP_ENV=${MEM_AGENT_ENV:-} derived=MEM_MAX_MEMORY ;;
    mem_update) SWEEP_ENV=${MEM_UPDATE_ENV:-} ;;
    *) echo "SWEEP_EXAMPLE=${SWEEP_EXAMPLE}: mem_agent or mem_update" >&2; return 2 ;;
  esac
  SWEEP_DATA_VARS="$(sed -n '/^DATA_VARS="/,/"$/p' "examples/${SWEEP_EXAMPLE}/run-smollm2-gpu.sh" |
    sed 's/^DATA_VARS=//' | tr -d '"' | xargs) ${derived}"
}

# variant_stage DIR GPU DATA_ROOT I STAGE VARS...: one stage of a variant's seed SEED (0), in DIR, with its data
# in DATA_ROOT
variant_stage() {
  local dir=$1 gpu=$2 data=$3 i=$4 stage=$5
  shift 5
  # shellcheck disable=SC2086  # SWEEP_ENV is a list of NAME=VALUE words
  env ${SWEEP_ENV} "$@" EVAL_SPLIT=val LENGTH="${SWEEP_LENGTH:-170}" VAL_LENGTH="${SWEEP_LENGTH:-170}" \
    SEEDS_PER_GPU="${SWEEP_PER_GPU:-1}" CUDA_VISIBLE_DEVICES="${gpu}" SEED="${SEED:-0}" VIME_EXT_OUT="${dir}" \
    DATA_ROOT="${data}" RAY_PORT_BASE=$(( 6500 + 10 * i )) \
    bash "examples/${SWEEP_EXAMPLE}/run-smollm2-gpu.sh" "${stage}"
}

# sweep_variant DIR GPU DATA_ROOT I VARS...: one variant's seed (after its own prepare when DATA_ROOT is in DIR)
sweep_variant() {
  if [ "$3" = "$1/data" ]; then variant_stage "$1" "$2" "$3" "$4" prepare "${@:5}" || return; fi
  variant_stage "$1" "$2" "$3" "$4" seed "${@:5}"
}

# sweep_plan: the sweep's variants (trimmed), each one's data folder (the shared OUT_DIR/sweep/data, or its own
# OUT_DIR/sweep/v<i>/data when it sets a variable of the data) and GPU, into the arrays `variants`, `datas` and
# `variant_gpus` (of SWEEP_GPUS, default 0,1,2,3: `gpus`)
sweep_plan() {
  local i name
  IFS=';' read -r -a variants <<<"${SWEEP_VARIANTS:?SWEEP_VARIANTS: variants separated by ;}"
  IFS=',' read -r -a gpus <<<"${SWEEP_GPUS:-0,1,2,3}"
  datas=() variant_gpus=()
  for i in "${!variants[@]}"; do
    variants[i]=$(xargs <<<"${variants[i]}")  # trimmed
    datas[i]=${OUT_DIR}/sweep/data
    for name in ${SWEEP_DATA_VARS}; do
      if [[ " ${variants[i]} " == *" ${name}="* ]]; then datas[i]=${OUT_DIR}/sweep/v${i}/data; fi
    done
    variant_gpus[i]=${gpus[i % ${#gpus[@]}]}  # in turn, as seeds_on_gpus places seeds
  done
}

# shared_prepare: the shared data (OUT_DIR/sweep/data), when a variant runs on it (MemUpdate's 1.5B prepare takes
# 2 minutes of a lease)
shared_prepare() {
  local root=${OUT_DIR}/sweep
  if [[ " ${datas[*]} " != *" ${root}/data "* ]]; then return 0; fi
  log "sweep: ${SWEEP_EXAMPLE}: prepare (${root}/data)"
  mkdir -p "${root}"
  # shellcheck disable=SC2086  # SWEEP_ENV is a list of NAME=VALUE words
  env ${SWEEP_ENV} EVAL_SPLIT=val LENGTH="${SWEEP_LENGTH:-170}" VAL_LENGTH="${SWEEP_LENGTH:-170}" \
    VIME_EXT_OUT="${root}" bash "examples/${SWEEP_EXAMPLE}/run-smollm2-gpu.sh" prepare \
    >"${root}/prepare.log" 2>&1 || { log "sweep: prepare failed: ${root}/prepare.log"; return 1; }
}

# sweep_audit ROOT N: MemUpdate's variants' edits side by side (examples/mem_update/edit_audit.py: the memory each
# policy updates first, the rationale, deletions), from the episodes of each one's evaluations that wrote them,
# into ROOT/edit_audit.md/.json
sweep_audit() {
  local root=$1 n=$2 i kind file rows=()
  [ "${SWEEP_EXAMPLE}" = mem_update ] || return 0
  for (( i = 0; i < n; i++ )); do
    for kind in sft rl; do
      file=${root}/v${i}/eval_val/${kind}_s${SEED:-0}.samples.jsonl
      if [ -s "${file}" ]; then rows+=("v${i} $([ "${kind}" = sft ] && echo SFT || echo SFT + RL)=${file}"); fi
    done
  done
  if (( ${#rows[@]} )); then python -m examples.mem_update.edit_audit "${rows[@]}" --out "${root}/edit_audit"; fi
}

sweep() {
  local root=${OUT_DIR}/sweep variants datas variant_gpus gpus i pids=() status=0 rows=() per_gpu=${SWEEP_PER_GPU:-1}
  sweep_settings || return
  sweep_plan
  if (( ${#variants[@]} > ${#gpus[@]} * per_gpu )); then
    echo "gpu_learning.sh sweep: ${#variants[@]} variants for ${#gpus[@]} GPU(s) (SWEEP_GPUS) at" \
      "SWEEP_PER_GPU=${per_gpu}: at most $(( ${#gpus[@]} * per_gpu ))" >&2
    return 2
  fi
  mkdir -p "${root}"
  shared_prepare || return
  for i in "${!variants[@]}"; do
    log "sweep: start v${i} (GPU ${variant_gpus[i]}) ${variants[i]:-(the recipe)}; data ${datas[i]}"
    mkdir -p "${root}/v${i}"
    # shellcheck disable=SC2086  # a variant is a list of NAME=VALUE words
    sweep_variant "${root}/v${i}" "${variant_gpus[i]}" "${datas[i]}" "${i}" ${variants[i]} \
      >"${root}/v${i}.log" 2>&1 &
    pids+=($!)
    rows+=(--variant "${variants[i]}=${root}/v${i}")
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[i]}"; then log "sweep: end v${i}: exit 0"; else log "sweep: end v${i}: failed"; status=1; fi
  done
  python tools/sweep_table.py "${rows[@]}" --out "${root}/sweep" || status=1
  sweep_audit "${root}" "${#variants[@]}" || status=1
  log "sweep done: exit ${status}"
  return "${status}"
}

# data FILE: before a lease, on any machine (no GPU): the sweep's data made as `sweep` makes it (the same SWEEP_*
# and example variables), packed into FILE.tar.xz (hundreds of KB: each chat repeats the store); on the GPU
# machine `tar -xJf FILE.tar.xz -C VIME_EXT_OUT` before `sweep`, whose prepare then keeps it (a minute to three of
# the lease saved a data folder). The data is made under the GPU image's transformers (IMAGE_TRANSFORMERS, default
# tools/gpu_wheels.py's IMAGE_PINS, with its tokenizers and huggingface-hub), which renders the chat templates and
# builds the packaged models' tokenizers that chats are cut to a context by, and which `prepare_once` stamps:
# where this machine has another release, the image's is installed from PyPI into IMAGE_SITE (default
# ~/.cache/vime_ext/image_transformers_<release>) and put first on PYTHONPATH.
data() {
  local file=${1:?usage: gpu_learning.sh data FILE} root=${OUT_DIR}/sweep variants datas variant_gpus gpus i rels=()
  local want have site
  sweep_settings || return
  sweep_plan
  want=${IMAGE_TRANSFORMERS:-$(image_pin transformers)}
  have=$(installed_release transformers)
  if [ "${want}" != "${have}" ]; then
    site=${IMAGE_SITE:-${HOME}/.cache/vime_ext/image_transformers_${want}}
    if [ ! -f "${site}/.installed" ]; then
      python -m pip install -q --no-deps --target "${site}" "transformers==${want}" \
        "tokenizers==$(image_pin tokenizers)" "huggingface-hub==$(image_pin huggingface-hub)" || return
      touch "${site}/.installed"
    fi
    export PYTHONPATH=${site}${PYTHONPATH:+:${PYTHONPATH}}
    have=$(installed_release transformers)
    [ "${have}" = "${want}" ] || { log "data: transformers ${have} from ${site}, not ${want}"; return 1; }
  fi
  log "data: ${SWEEP_EXAMPLE}, transformers ${have}"
  shared_prepare || return
  for i in "${!variants[@]}"; do
    if [ "${datas[i]}" != "${root}/v${i}/data" ]; then continue; fi
    log "data: v${i} (${variants[i]}): prepare (${datas[i]})"
    mkdir -p "${root}/v${i}"
    # shellcheck disable=SC2086  # a variant is a list of NAME=VALUE words
    variant_stage "${root}/v${i}" "${variant_gpus[i]}" "${datas[i]}" "${i}" prepare ${variants[i]} \
      >"${root}/v${i}.prepare.log" 2>&1 || { log "data: v${i}: prepare failed: ${root}/v${i}.prepare.log"; return 1; }
  done
  for i in $(printf '%s\n' "${datas[@]}" | sort -u); do rels+=("${i#"${OUT_DIR}"/}"); done
  tar -cJf "${file}.tar.xz" -C "${OUT_DIR}" "${rels[@]}"
  log "data: ${file}.tar.xz ($(du -h "${file}.tar.xz" | cut -f1)): ${rels[*]}"
}

# installed_release NAME: the release of NAME that this python imports (PYTHONPATH first)
installed_release() {
  python -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$1"
}

# image_pin NAME: the GPU image's release of NAME (tools/gpu_wheels.py IMAGE_PINS)
image_pin() {
  python -c 'import sys; sys.path.insert(0, "tools"); from gpu_wheels import IMAGE_PINS
print(IMAGE_PINS[sys.argv[1]])' "$1"
}

# pack FILE: the readable results so far (the run may still be going), weights and generated data left out, and
# the fact-consolidation episodes (eval_fact/*.samples*.jsonl: each quotes its 455-fact context, MemoryAgentBench's
# data of unknown licence; their summaries come back)
pack() {
  local file=${1:?usage: gpu_learning.sh pack FILE}
  (cd "${OUT_DIR}" && find . \( -path '*/data' -o -name 'iter_*' -o -name 'hf' -o -path '*/rl/rollouts' \) -prune -o \
    -path '*/eval_fact/*.samples*.jsonl' -prune -o \
    -type f \( -name '*.jsonl' -o -name '*.jsonl.xz' -o -name '*.json' -o -name '*.md' -o -name '*.png' \
    -o -name '*.log' -o -name 'events.out.tfevents.*' -o -name 'latest_checkpointed_iteration.txt' \
    -o -name 'reader_replies.sqlite' \) \
    -print0 |
    tar --null -czf - -T -) >"${file}.tar.gz"
  echo "${file}.tar.gz: $(du -h "${file}.tar.gz" | cut -f1)"
}

case "${1:-}" in
  run) run ;;
  sweep) sweep ;;
  data) data "${2:-}" ;;
  pack) pack "${2:-}" ;;
  *) echo "usage: gpu_learning.sh run|sweep|data FILE|pack FILE" >&2; exit 2 ;;
esac
