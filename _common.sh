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
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
# vLLM's tensor-parallel all-reduce fusion: FlashInfer's single-node backend, not its multicast one (mnnvl).
export VLLM_FLASHINFER_ALLREDUCE_BACKEND="${VLLM_FLASHINFER_ALLREDUCE_BACKEND:-trtllm}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  NUM_GPUS=$(nvidia-smi -L | wc -l)
  # CUDA_VISIBLE_DEVICES narrows what this script (and the Ray head it starts) may use; nvidia-smi ignores it.
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    NUM_GPUS=$(tr ',' '\n' <<<"${CUDA_VISIBLE_DEVICES}" | grep -c '[^[:space:]]' || true)
  fi
else
  NUM_GPUS=0
fi
export NUM_GPUS

start_ray() {
  # Ray for train.py. RAY_ADDRESS set: that cluster (several nodes: `ray start` on each first), used as it is.
  # Otherwise a head on this machine's RAY_PORT, started here in a temporary folder of its own and stopped when
  # the script exits (only its processes: other Ray clusters on the machine are left alone); train.py is given
  # its address.
  if [ -n "${RAY_ADDRESS:-}" ]; then return 0; fi
  local port=${RAY_PORT:-6379} cpus
  # Token authentication, Ray's recommendation, for the head and train.py alike: where a token file exists
  # (~/.ray/auth_token, left by any earlier Ray), `ray start` turns it on while a driver left at Ray's default
  # does not, and the driver is refused.
  export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
  if [ "${RAY_AUTH_MODE}" = token ]; then ray get-auth-token --generate >/dev/null; fi
  cpus=$(nproc)
  # Without GPUs every trainer rank and the rollout manager take a logical CPU, whatever the core count.
  if [ "${NUM_GPUS}" -eq 0 ] && [ "${cpus}" -lt 8 ]; then cpus=8; fi
  # Ray's client server and dashboard agent listen on fixed default ports; moved next to RAY_PORT, so that a head
  # takes RAY_PORT to RAY_PORT + 2 and heads 3 apart (scripts on one machine's GPUs, each with its
  # CUDA_VISIBLE_DEVICES) do not collide. A port in use is refused here: Ray would report a failed GCS connection
  # (or join the wrong cluster's gRPC server) with no word of the port.
  local taken
  taken=$(python3 -c 'import socket, sys
for p in range(int(sys.argv[1]), int(sys.argv[1]) + 3):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", p))
        except OSError:
            print(p)
            break' "${port}")
  if [ -n "${taken}" ]; then
    echo "RAY_PORT=${port}: port ${taken} is in use (a head takes RAY_PORT to RAY_PORT + 2); give each script on" \
      "this machine its own RAY_PORT, at least 3 apart, or RAY_ADDRESS to join a running cluster" >&2
    return 2
  fi
  VIME_EXT_RAY_DIR=$(mktemp -d /tmp/vime_ext_ray.XXXXXX)
  echo "starting a Ray head on 127.0.0.1:${port} (${NUM_GPUS} GPUs, ${cpus} CPUs); stopped when this script exits"
  trap stop_ray EXIT
  # In a session of its own: the head's client server, its agents and its workers do not name the temporary
  # folder on their command lines, and stop_ray finds them all by the session instead.
  setsid -w ray start --head --node-ip-address 127.0.0.1 --port "${port}" --num-cpus "${cpus}" \
    --num-gpus "${NUM_GPUS}" --ray-client-server-port $((port + 1)) --dashboard-agent-listen-port $((port + 2)) \
    --temp-dir "${VIME_EXT_RAY_DIR}" --disable-usage-stats --include-dashboard=false >/dev/null
  # (empty where no process names the folder, as with a stand-in `ray`: stop_ray then goes by the folder)
  VIME_EXT_RAY_SID=$(ps -o sid= -p "$(pgrep -o -f -- "${VIME_EXT_RAY_DIR}")" 2>/dev/null | tr -d ' ' || true)
  export RAY_ADDRESS="127.0.0.1:${port}"
}

stop_ray() {
  # The head start_ray started, and nothing else: the processes of its session (or, where that was not found,
  # those that name its temporary folder), never this script's own session.
  if [ -z "${VIME_EXT_RAY_DIR:-}" ]; then return 0; fi
  local which=(-f -- "${VIME_EXT_RAY_DIR}")
  if [ -n "${VIME_EXT_RAY_SID:-}" ] && [ "${VIME_EXT_RAY_SID}" != "$(ps -o sid= -p $$ | tr -d ' ')" ]; then
    which=(-s "${VIME_EXT_RAY_SID}")
  fi
  pkill -TERM "${which[@]}" 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    pgrep "${which[@]}" >/dev/null || break
    sleep 1
  done
  pkill -KILL "${which[@]}" 2>/dev/null || true
  rm -rf "${VIME_EXT_RAY_DIR}"
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

ensure_torch_dist() {  # ensure_torch_dist HF_DIR TORCH_DIST_DIR: convert once (starting weights, KL reference) when missing
  if [ ! -f "$2/latest_checkpointed_iteration.txt" ]; then
    echo "TORCH_DIST $2 missing: converting $1 (the starting weights and the KL reference)"
    # bf16 like the trainer on GPUs; without GPUs the trainer computes in the checkpoint's own dtype.
    python tools/convert_hf_to_torch_dist.py --hf-checkpoint "$1" --save "$2" \
      --dtype "$( [ "${NUM_GPUS}" -gt 0 ] && echo bfloat16 || echo auto )"
  fi
}

# vime's GRPO recipe for Qwen3-4B-class models, shared by the examples' run-qwen3-4b-train.sh: low-variance KL
# 0.001 to the reference, clip 0.2 (the upper clip is each example's), constant lr 1e-6, full recompute,
# token-budget micro-batches; on GPUs bf16 and megatron-core's distributed optimizer (states sharded over the
# data-parallel ranks) with the gradient reduction overlapped and accumulated in fp32. Without GPUs (tests, a
# tiny model) the same in fp32 with vime_ext's own AdamW, which takes none of megatron's optimizer flags.
GRPO_RECIPE_ARGS=(--recompute-granularity full --use-dynamic-batch-size --max-tokens-per-gpu 16384
  --use-kl-loss --kl-loss-coef 0.001 --kl-loss-type low_var_kl --eps-clip 0.2
  --lr 1e-6 --lr-decay-style constant --weight-decay 0.1 --adam-beta2 0.98 --clip-grad 1.0)
if [ "${NUM_GPUS}" -gt 0 ]; then
  GRPO_RECIPE_ARGS+=(--bf16 --use-distributed-optimizer --overlap-grad-reduce --accumulate-allreduce-grads-in-fp32)
fi

# How a machine's GPUs are used, from its GPU count unless the variables say otherwise (each example's README
# has the table): COLOCATE (1: engines share the trainer's GPUs and sleep while it trains; the default on one
# GPU), ACTOR_NODES (nodes for trainer ranks), ACTOR_GPUS (trainer GPUs per node), ROLLOUT_GPUS (engine GPUs,
# not with COLOCATE=1), TP, and OPTIMIZER_OFFLOAD (1: Adam's states and fp32 masters on the host; the default
# with one trainer GPU, where a 4B model's 48 GB of them do not fit beside its weights and gradients, and
# wherever a trainer GPU's share would not fit its memory: below).
gpu_memory_gib() {  # the smallest GPU's memory in GiB (0 without GPUs)
  if [ "${NUM_GPUS}" -eq 0 ]; then echo 0; return; fi
  nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | sort -n | head -1 | awk '{print int($1 / 1024)}'
}

gpu_layout() {
  local gpus=$(( NUM_GPUS > 0 ? NUM_GPUS : 1 ))
  COLOCATE=${COLOCATE:-$(( gpus == 1 ? 1 : 0 ))}
  ACTOR_NODES=${ACTOR_NODES:-1}
  if [ "${COLOCATE}" = 1 ]; then
    if [ -n "${ROLLOUT_GPUS:-}" ]; then
      echo "$(basename "$0"): ROLLOUT_GPUS=${ROLLOUT_GPUS} with COLOCATE=1: colocated engines use the trainer's GPUs" >&2
      exit 2
    fi
    ACTOR_GPUS=${ACTOR_GPUS:-${gpus}}
  else
    ACTOR_GPUS=${ACTOR_GPUS:-$(( gpus / 2 > 0 ? gpus / 2 : 1 ))}
    ROLLOUT_GPUS=${ROLLOUT_GPUS:-$(( gpus - ACTOR_GPUS > 0 ? gpus - ACTOR_GPUS : 1 ))}
  fi
  TP=${TP:-$(( ACTOR_GPUS >= 4 ? 2 : 1 ))}
  # Adam on the host when a trainer GPU cannot hold it. A 4B model's GiB per trainer GPU: bf16 weights and fp32
  # gradients, 24 split over TP; fp32 masters and Adam's two moments, 48 split over every trainer GPU (TP, then
  # megatron's distributed optimizer over the data-parallel ranks); 32 for the rest (the logits of 16384 tokens
  # and their gradient in fp32, activations, the allocator's slack). 2 trainer GPUs at TP 1 on 4 x H100 (79 GiB)
  # need 80 and ran out of memory at the second step (2026-11-28); on H200s (140 GiB) they fit. One trainer GPU
  # always offloads (104; on one GPU the engine's memory shares it too).
  local trainer_gpus=$(( ACTOR_NODES * ACTOR_GPUS ))
  OPTIMIZER_OFFLOAD=${OPTIMIZER_OFFLOAD:-$(( NUM_GPUS > 0 && (trainer_gpus == 1 \
    || 24 / TP + 48 / trainer_gpus + 32 > $(gpu_memory_gib)) ? 1 : 0 ))}
  LAYOUT_ARGS=(--actor-num-nodes "${ACTOR_NODES}" --actor-num-gpus-per-node "${ACTOR_GPUS}"
    --tensor-model-parallel-size "${TP}")
  if [ "${COLOCATE}" = 1 ]; then LAYOUT_ARGS+=(--colocate); else LAYOUT_ARGS+=(--rollout-num-gpus "${ROLLOUT_GPUS}"); fi
  if [ "${OPTIMIZER_OFFLOAD}" = 1 ]; then LAYOUT_ARGS+=(--optimizer-cpu-offload); fi
  echo "layout: ${ACTOR_NODES} node(s) x ${ACTOR_GPUS} trainer GPU(s), TP ${TP}, $( [ "${COLOCATE}" = 1 ] \
    && echo "engines colocated" || echo "${ROLLOUT_GPUS} engine GPU(s)"), optimizer offload ${OPTIMIZER_OFFLOAD}"
}

# The examples' Qwen3-4B GRPO launch: the GPU layout above, the starting weights converted once, saves resumed. The
# calling script sets TRAIN_DATA, SAVE_PATH, ROLLOUT_BATCH_SIZE and GLOBAL_BATCH_SIZE; HF_CKPT, TORCH_DIST,
# MODEL_ARGS_SCRIPT (the checked architecture flags; empty: read config.json alone), NUM_ROLLOUT,
# N_SAMPLES_PER_PROMPT, SAVE_INTERVAL (0: no checkpoints), SAVE_OPTIM (0: weights only, --no-save-optim) and ENGINE_MEMORY (vLLM's
# --gpu-memory-utilization) default here. Arguments (the example's plug-ins and settings, then the user's) go to
# train.py after the recipe, so a user's flag overrides the recipe's.
grpo_qwen3_4b_train() {
  HF_CKPT=${HF_CKPT:-/models/Qwen3-4B}
  TORCH_DIST=${TORCH_DIST:-${HF_CKPT%/}_torch_dist}
  MODEL_ARGS_SCRIPT=${MODEL_ARGS_SCRIPT-${VIME_EXT_ROOT}/scripts/models/qwen3-4B.sh}
  NUM_ROLLOUT=${NUM_ROLLOUT:-100} N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8}
  SAVE_INTERVAL=${SAVE_INTERVAL:-50} SAVE_OPTIM=${SAVE_OPTIM:-1}
  need "${HF_CKPT}/config.json" HF_CKPT
  need "${TRAIN_DATA}" TRAIN_DATA
  gpu_layout
  # Colocated engines leave room for what the trainer cannot hand back (its CUDA context, allocator fragments).
  ENGINE_MEMORY=${ENGINE_MEMORY:-$( [ "${COLOCATE}" = 1 ] && echo 0.7 || echo 0.8 )}
  ensure_torch_dist "${HF_CKPT}" "${TORCH_DIST}"
  MODEL_ARGS=()
  if [ -n "${MODEL_ARGS_SCRIPT}" ]; then source "${MODEL_ARGS_SCRIPT}"; fi
  local extra=()
  if [ "${SAVE_INTERVAL}" = 0 ]; then  # no checkpoints (benchmarks); a checkpoint in SAVE_PATH still resumes
    extra+=(--load "${SAVE_PATH}")
  else
    extra+=(--save "${SAVE_PATH}" --save-interval "${SAVE_INTERVAL}" --load "${SAVE_PATH}")
    if [ "${SAVE_OPTIM}" = 0 ]; then extra+=(--no-save-optim); fi
  fi
  if [ "${NUM_GPUS}" -gt 0 ]; then extra+=(--vllm-gpu-memory-utilization "${ENGINE_MEMORY}"); fi
  start_ray
  python train.py "${MODEL_ARGS[@]}" \
    --hf-checkpoint "${HF_CKPT}" --ref-load "${TORCH_DIST}" --prompt-data "${TRAIN_DATA}" --rollout-shuffle \
    "${LAYOUT_ARGS[@]}" "${GRPO_RECIPE_ARGS[@]}" \
    --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size "${ROLLOUT_BATCH_SIZE}" \
    --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}" --global-batch-size "${GLOBAL_BATCH_SIZE}" \
    --rollout-temperature 1.0 "${extra[@]}" "$@"
}

# The examples' small-model learning recipes (run-smollm2-gpu.sh) share what follows.
# model_dir VALUE: VALUE when it is a folder (or a path), else the folder of the packaged model of that name
# (smollm2-135m, qwen2.5-coder-1.5b: python -m vime_ext.models.packaged, built once and cached)
model_dir() {
  local built
  if [ -d "$1" ] || [[ "$1" == */* ]]; then
    echo "$1"
  else
    built=$(python -m vime_ext.models.packaged "$1") || return $?
    echo "${built##*$'\n'}"  # the last line: the folder (a build may log before it)
  fi
}

# smollm2_recipe_defaults ROLLOUTS: HF_CKPT, the policy (default smollm2-135m; a folder or a packaged model's
# name: model_dir), the seeds and the GRPO run's size: ROLLOUTS (the recipe's published step count) at lr 2e-5,
# the rate of every published row; the caller's values win.
smollm2_recipe_defaults() {
  HF_CKPT=$(model_dir "${HF_CKPT:-smollm2-135m}")
  need "${HF_CKPT}/config.json" HF_CKPT
  export HF_CKPT
  SEED=${SEED:-0} SEEDS=${SEEDS:-"0 1 2"}
  RL_ROLLOUTS=${RL_ROLLOUTS:-${1:?smollm2_recipe_defaults ROLLOUTS}} RL_LR=${RL_LR:-2e-5}
  ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-16} N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8}
  shared_gpu_defaults
}

# shared_gpu_defaults: SEEDS_PER_GPU (default 1) seeds run on each GPU at once (seeds_on_gpus). vLLM sizes an
# engine's KV cache from the free memory of the whole device before and after its profile run, so what another
# seed's engines and trainer take or give back meanwhile (their sleep and wake, the trainer's offload) would be
# counted as this engine's: its cache too small, or an "Error in memory profiling". With several seeds a GPU every
# engine of the recipe therefore gets a fixed cache of KV_CACHE_GIB (default 8: SmolLM2's 372K tokens, the 1.5B
# reader's 300K), vLLM's --kv-cache-memory-bytes, which skips that sizing; its memory share (ENGINE_MEMORY,
# RM_MEMORY, EVAL_ENGINE_MEMORY, READER_MEMORY, default 0.05) is then only the free memory vLLM checks for at
# its start. KV_CACHE_GIB alone (one seed a GPU) fixes the caches too. Sets KV_ARGS (train.py's and the
# evaluations' --vllm-* flags). Several seeds a GPU also halve SFT's micro-batches (SFT_MAX_TOKENS 16384): at
# 32768 tokens each SmolLM2 SFT run held 58.7 GiB of an H200, and two of them left the rows without training,
# started beside them, too little to start (MemUpdate, 2026-11-30). The step's gradient is the same sum.
# Three or more seeds a GPU shrink every part further (not yet run on a GPU): caches of 4 GiB, and SFT's and
# GRPO's micro-batches of 8192 tokens (SFT_MAX_TOKENS, RL_MAX_TOKENS; no lower than an episode's bound,
# MAX_MODEL_LEN). At two seeds an H200 peaked at 127 GiB, GRPO's trainer holding 27.5 GiB at 32768 tokens (the
# 135M model's logits) and each seed four engines with caches of 8 GiB (policy and reader, GRPO's and the SFT
# evaluation's; MemUpdate, 2026-11-30).
shared_gpu_defaults() {
  SEEDS_PER_GPU=${SEEDS_PER_GPU:-1}
  KV_ARGS=()
  if [ "${SEEDS_PER_GPU}" -gt 2 ]; then
    KV_CACHE_GIB=${KV_CACHE_GIB:-4} SFT_MAX_TOKENS=${SFT_MAX_TOKENS:-8192} RL_MAX_TOKENS=${RL_MAX_TOKENS:-8192}
  fi
  if [ "${SEEDS_PER_GPU}" -gt 1 ]; then KV_CACHE_GIB=${KV_CACHE_GIB:-8} SFT_MAX_TOKENS=${SFT_MAX_TOKENS:-16384}; fi
  if [ -n "${KV_CACHE_GIB:-}" ] && [ "${NUM_GPUS}" -gt 0 ]; then
    KV_ARGS=(--vllm-kv-cache-memory-bytes $(( KV_CACHE_GIB * 1024 * 1024 * 1024 )))
    ENGINE_MEMORY=${ENGINE_MEMORY:-0.05} RM_MEMORY=${RM_MEMORY:-0.05}
    EVAL_ENGINE_MEMORY=${EVAL_ENGINE_MEMORY:-0.05} READER_MEMORY=${READER_MEMORY:-0.05}
  fi
}

# grpo_from_sft LAUNCH_SCRIPT WORK SEED [train.py flags]: an example's Qwen3-4B launch script through its variables,
# scaled to the small model: colocated on this GPU, from the SFT save WORK/seed_SEED/sft (the starting weights
# and the KL reference) to WORK/seed_SEED/rl, RL_ROLLOUTS rollouts of ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT,
# one optimizer step each, lr RL_LR, contexts of MAX_MODEL_LEN, a Ray head on RAY_PORT_BASE + 3 x SEED (seeds run
# at once on one machine; a head takes 3 ports), sampling at RL_TEMPERATURE (1.0). RL_MINUTES (unset: no limit)
# bounds the run's time (--exit-duration-in-mins): it stops after the first rollout that ends past it and saves
# that one, so that what follows (the evaluation) still fits a machine's time slot. The trainer's micro-batches
# hold at most RL_MAX_TOKENS (32768) tokens. Two knobs for a warm start too peaked for GRPO's groups to differ
# (unset: off): RL_ENTROPY_COEF, an entropy bonus (--entropy-coef); RL_OVERSAMPLE=K, DAPO's
# dynamic sampling (only groups whose rewards differ train; K x ROLLOUT_BATCH_SIZE prompts drawn a round). And
# one to hold the policy nearer its SFT start: RL_KL_COEF, the KL term's weight (unset: the recipe's 0.001). The
# caller sets TRAIN_DATA. Every rollout is saved (--save-debug-rollout-data WORK/seed_SEED/rl/rollouts: token
# lists and all, for tools/replay_rollout.py; 64 of the 1.5B MemUpdate episodes of 8k tokens are 14 MB), and when
# GRPO ends, failed or not, the first and last of them are written again without their token lists to
# WORK/seed_SEED/rl/rollout_replies.jsonl.xz (tools/rollout_replies.py): what GRPO's sampled episodes did, small
# enough to bring back from a lease (the evaluations' are greedy).
grpo_from_sft() {
  local script=$1 work=$2 seed=$3 knobs=() status=0
  local rollouts=${2}/seed_${3}/rl/rollouts
  shift 3
  if (( ${RL_MAX_TOKENS:-32768} < MAX_MODEL_LEN )); then
    echo "RL_MAX_TOKENS=${RL_MAX_TOKENS}: a micro-batch must hold an episode of MAX_MODEL_LEN=${MAX_MODEL_LEN} tokens" >&2
    return 2
  fi
  if [ -n "${RL_MINUTES:-}" ]; then knobs=(--exit-duration-in-mins "${RL_MINUTES}"); fi
  if [ -n "${RL_ENTROPY_COEF:-}" ]; then knobs+=(--entropy-coef "${RL_ENTROPY_COEF}"); fi
  if [ -n "${RL_KL_COEF:-}" ]; then knobs+=(--kl-loss-coef "${RL_KL_COEF}"); fi  # after the recipe's: it wins
  if [ -n "${RL_OVERSAMPLE:-}" ]; then
    knobs+=(--dynamic-sampling-filter-path vime_ext.rollout.filters.check_reward_nonzero_std
            --over-sampling-batch-size $(( ROLLOUT_BATCH_SIZE * RL_OVERSAMPLE )))
  fi
  TORCH_DIST=${work}/seed_${seed}/sft MODEL_ARGS_SCRIPT="" COLOCATE=1 ACTOR_GPUS=1 OPTIMIZER_OFFLOAD=0 \
    SAVE_PATH=${work}/seed_${seed}/rl NUM_ROLLOUT=${RL_ROLLOUTS} ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE} \
    N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT} GLOBAL_BATCH_SIZE=$(( ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT )) \
    SAVE_INTERVAL=${RL_ROLLOUTS} SAVE_OPTIM=0 ENGINE_MEMORY=${ENGINE_MEMORY:-0.3} \
    RAY_PORT=$(( ${RAY_PORT_BASE:-6380} + 3 * seed )) \
    bash "${script}" --lr "${RL_LR}" --seed "${seed}" --engine-max-model-len "${MAX_MODEL_LEN}" \
    --rollout-temperature "${RL_TEMPERATURE:-1.0}" \
    --max-tokens-per-gpu "${RL_MAX_TOKENS:-32768}" --recompute-granularity selective \
    --save-debug-rollout-data "${rollouts}" "${knobs[@]}" "${KV_ARGS[@]}" "$@" || status=$?
  if compgen -G "${rollouts}/rollout_*.json" >/dev/null; then
    python "${VIME_EXT_ROOT}/tools/rollout_replies.py" "${rollouts}" \
      --out "${work}/seed_${seed}/rl/rollout_replies.jsonl.xz" >/dev/null ||
      echo "tools/rollout_replies.py failed on ${rollouts}: no rollout_replies.jsonl.xz" >&2
  fi
  return "${status}"
}

# grpo_beside_sft_eval EVALUATE WORK SEED LAUNCH_SCRIPT [train.py flags]: GRPO from the SFT save (grpo_from_sft) and,
# on the same GPU once GRPO has logged its first rollout (or ended), the SFT save's evaluation (the caller's
# EVALUATE sft_sSEED WORK/seed_SEED/sft, logged to WORK/seed_SEED/sft_eval.log); then the RL save's (EVALUATE
# rl_sSEED WORK/seed_SEED/rl). The SFT row exists even when GRPO fails, and the seed's last step is one evaluation
# instead of two. An SFT evaluation that fails beside GRPO runs once more after it (again_if_failed). Fails if any
# part did. SFT_EVAL_BESIDE=0: one after the other instead (grpo_then_evaluations). Why the evaluation waits:
# engines on one GPU start one at a time, and GRPO's, queued behind the evaluation's (MemUpdate's: a model and a
# reader), lost 2-3 minutes of RL_MINUTES (4 x H200 runs of 2026-11-26 and 27).
grpo_beside_sft_eval() {
  local evaluate=$1 work=$2 seed=$3 script=$4 grpo sft_eval status=0
  local metrics=${work}/seed_${seed}/rl/tensorboard/metrics.jsonl
  shift 4
  if [ "${SFT_EVAL_BESIDE:-1}" = 0 ]; then
    grpo_then_evaluations "${evaluate}" "${work}" "${seed}" "${script}" "$@"
    return
  fi
  grpo_from_sft "${script}" "${work}" "${seed}" "$@" &
  grpo=$!
  while kill -0 "${grpo}" 2>/dev/null && [ ! -s "${metrics}" ]; do sleep 2; done
  echo "$(date +%T) the SFT evaluation starts (GRPO's first rollout is logged, or GRPO ended)"
  "${evaluate}" "sft_s${seed}" "${work}/seed_${seed}/sft" >"${work}/seed_${seed}/sft_eval.log" 2>&1 &
  sft_eval=$!
  wait "${grpo}" || status=$?
  rl_evaluation "${evaluate}" "${work}" "${seed}" "${status}" || status=$?
  again_if_failed "${sft_eval}" "the SFT evaluation" GRPO "${work}/seed_${seed}/sft_eval.log" \
    "${evaluate}" "sft_s${seed}" "${work}/seed_${seed}/sft" ||
    { echo "the SFT evaluation failed again: no SFT row for seed ${seed}" >&2; status=1; }
  return "${status}"
}

# grpo_then_evaluations EVALUATE WORK SEED LAUNCH_SCRIPT [train.py flags]: the same one after the other (GRPO, the
# SFT save's evaluation, the RL save's), for a GPU without room for an evaluation beside GRPO (SFT_EVAL_BESIDE=0):
# on an 80-GB H100 the 1.5B MemUpdate policy's GRPO ran out of memory in its seventh step once the SFT evaluation's
# two engines (13.6 GiB each, KV_CACHE_GIB=8) had started beside its trainer (34.7 GiB at 8192-token micro-batches)
# and reward reader (14.4 GiB), 2026-12-02. Fails if any part did; the SFT row is made even when GRPO fails.
grpo_then_evaluations() {
  local evaluate=$1 work=$2 seed=$3 script=$4 grpo=0 status=0
  shift 4
  grpo_from_sft "${script}" "${work}" "${seed}" "$@" || grpo=$?
  "${evaluate}" "sft_s${seed}" "${work}/seed_${seed}/sft" >"${work}/seed_${seed}/sft_eval.log" 2>&1 ||
    { echo "the SFT evaluation failed (${work}/seed_${seed}/sft_eval.log): no SFT row for seed ${seed}" >&2; status=1; }
  rl_evaluation "${evaluate}" "${work}" "${seed}" "${grpo}" || status=$?
  return "${status}"
}

# rl_evaluation EVALUATE WORK SEED GRPO_STATUS: the RL save's evaluation (EVALUATE rl_sSEED WORK/seed_SEED/rl) after
# a GRPO run that exited 0; after one that failed, why there is none, and GRPO's status
rl_evaluation() {
  if [ "$4" = 0 ]; then
    "$1" "rl_s$3" "$2/seed_$3/rl"
    return
  fi
  echo "GRPO failed (exit $4): no SFT + RL evaluation for seed $3" >&2
  return "$4"
}

# again_if_failed PID WHAT BESIDE LOG COMMAND...: waits for PID, COMMAND started in the background beside BESIDE on
# its GPU, its output in LOG; if it failed, says so and runs COMMAND once more, alone now, its output added to LOG.
# Beside a trainer an evaluation's engines can find too little memory (the 1.5B MemUpdate policy's SFT and GRPO
# held 105-128 GiB of an H200, 2026-11-30); evaluations resume from their samples file. Fails if that run fails.
again_if_failed() {
  local pid=$1 what=$2 beside=$3 log=$4
  shift 4
  wait "${pid}" && return 0
  echo "${what} failed beside ${beside} (${log}): again, alone" >&2
  "$@" >>"${log}" 2>&1
}

# sft_warm_start HF_DIR CHATS SAVE SEED LR EPOCHS [train.py flags]: supervised fine-tuning on demonstration chats
# (one chat a JSONL line), SFT_BATCH (64) chats a step for EPOCHS passes in micro-batches of at most
# SFT_MAX_TOKENS (32768) tokens, no engine; with SFT_HELDOUT (a chats file) its loss before and after. The rate
# rises linearly over SFT_WARMUP (0) steps, then falls on a cosine to 0. (The 1.5B MemUpdate policy at 1e-4 with
# no warm-up diverged at step 8 of 25, gradient norm 657, and came out writing broken tool calls; H200,
# 2026-12-03, records/mem_update_h200_1p5b_val/.) Token rows that HF_DIR never trained and the chats train on
# (Qwen2.5-Coder-1.5B-Instruct's <tool_call>) start from their spelling, in a copy beside the chats
# (vime_ext/rollout/untrained_tokens.py); HF_DIR itself when there are none. SFT_FIT=N (unset: off): then the save's
# last iteration as an HF checkpoint (the one its evaluation serves) and tools/sft_fit.py on the first N chats, the
# start and that checkpoint (trained tokens' NLL, first trained token, greedy reply), in SAVE/sft_fit.txt; a failed
# check only says so.
sft_warm_start() {
  local hf=$1 chats=$2 save=$3 seed=$4 lr=$5 epochs=$6 batch=${SFT_BATCH:-64} rollouts extra=()
  shift 6
  hf=$(python -m vime_ext.rollout.untrained_tokens --hf "${hf}" --chats "${chats}" \
    --out "$(dirname "${chats}")/started_$(basename "${hf}")") || return
  rollouts=$(( (epochs * $(wc -l <"${chats}") + batch - 1) / batch ))
  if [ -n "${SFT_HELDOUT:-}" ]; then
    extra+=(--eval-prompt-data heldout "${SFT_HELDOUT}" --eval-interval "${rollouts}")
  fi
  if [ "${NUM_GPUS}" -gt 0 ]; then extra+=(--bf16); fi
  python train.py --hf-checkpoint "${hf}" --prompt-data "${chats}" --input-key messages \
    --loss-type sft_loss --rollout-function-path vime_ext.rollout.sft_rollout.generate_rollout \
    --n-samples-per-prompt 1 --rollout-batch-size "${batch}" --global-batch-size "${batch}" \
    --num-rollout "${rollouts}" --rollout-shuffle --seed "${seed}" --lr "${lr}" --lr-warmup-iters "${SFT_WARMUP:-0}" \
    --lr-decay-style cosine --min-lr 0 \
    --use-dynamic-batch-size --max-tokens-per-gpu "${SFT_MAX_TOKENS:-32768}" --save "${save}" --no-save-optim \
    "${extra[@]}" "$@" || return
  if [ -n "${SFT_FIT:-}" ]; then sft_fit "${hf}" "${save}" "${chats}" "${SFT_FIT}"; fi
}

# sft_fit HF_DIR SAVE CHATS N: SFT_FIT's check (sft_warm_start)
sft_fit() {
  local trained
  trained=$(SAVE_PATH=$2 HF_CKPT=$1 bash "${VIME_EXT_ROOT}/tools/convert_iteration_to_hf.sh" | tail -1) &&
    python "${VIME_EXT_ROOT}/tools/sft_fit.py" --hf "$1" --hf "${trained}" --chats "$3" --n "$4" >"$2/sft_fit.txt" &&
    echo "SFT fit (tools/sft_fit.py): $2/sft_fit.txt" && grep "mean over" "$2/sft_fit.txt" ||
    echo "SFT_FIT: the check failed ($2/sft_fit.txt); training goes on" >&2
}

# models_with_results PATTERN NAME=GLOB...: MODEL_ARGS becomes `--model NAME=GLOB` for each model with a result
# file (PATTERN, with %s for the GLOB); a model with none yet (its seed failed, or its evaluation is still to run)
# is left out with a line on stderr, so that a learning recipe's table shows the rows that exist
models_with_results() {
  local pattern=$1 spec files
  shift
  MODEL_ARGS=()
  for spec in "$@"; do
    files=${pattern//%s/${spec#*=}}
    if compgen -G "${files}" >/dev/null; then
      MODEL_ARGS+=(--model "${spec}")
    else
      echo "table: no results for ${spec%%=*} yet (${files}): its row is left out" >&2
    fi
  done
}

# eval_split [NAME...]: SPLIT_SUFFIX for EVAL_SPLIT (test, the default: "", val: _val), the learning recipes'
# held-out part to score: validation to choose settings on, test for the one report with the setting chosen; a
# recipe's other evaluation sets (the NAMEs it accepts) get _NAME
eval_split() {
  case "${EVAL_SPLIT:=test}" in
    test) SPLIT_SUFFIX="" ;;
    val) SPLIT_SUFFIX=_val ;;
    *)
      if [[ " $* " != *" ${EVAL_SPLIT} "* ]]; then
        echo "EVAL_SPLIT=${EVAL_SPLIT}: one of test val${*:+ $*}" >&2
        return 2
      fi
      SPLIT_SUFFIX=_${EVAL_SPLIT} ;;
  esac
}

# recipe_gpus: the GPUs a learning recipe's seeds go to, CUDA_VISIBLE_DEVICES (else the machine's), a word each
recipe_gpus() {
  local gpus=(${CUDA_VISIBLE_DEVICES:-$(seq -s ' ' 0 $(( NUM_GPUS > 0 ? NUM_GPUS - 1 : 0 )))})
  echo "${gpus[@]//,/ }"
}

# all_status STATUS: a recipe's `all` stage goes on past a failed seed, so that the table shows the rows that
# finished; then its exit status says a seed failed (seeds_on_gpus named its log), not 0.
all_status() {
  if [ "$1" != 0 ]; then echo "a seed failed (its log is named above): the table holds the rows that finished" >&2; fi
  return "$1"
}

# prepare_once FUNCTION NAME...: FUNCTION (a recipe's prepare) unless DATA_ROOT was prepared to its end with the
# same values of the variables NAME... (the recipe's DATA_VARS: every one its prepare reads), as DATA_ROOT/prepared.env
# says: then the data is kept, so that a rerun after a crash or a lease given data prepared on another machine
# spends no time on it. The stamp is removed before FUNCTION runs and written after it ends, so an interrupted
# prepare is never taken as done; changing any of the variables prepares again. The stamp also names the
# transformers release, which renders the chat templates (and builds the packaged models' tokenizers) that chats
# are cut to a context by: data from another release is made again. The 1.5B policy's sweep chats, cut to 8,192
# tokens on the CPU (5.19), were longer than that for 3-16% of each SFT batch on the GPU image (5.17), which
# skipped them (2026-12-03; which of the two differed was not found).
prepare_once() {
  local prepare=$1 name stamp=""
  shift
  for name in "$@"; do stamp+="${name}=${!name:-}"$'\n'; done
  stamp+="transformers=$(python -c 'import importlib.metadata as m; print(m.version("transformers"))')"$'\n'
  if [ -f "${DATA_ROOT}/prepared.env" ] && [ "$(cat "${DATA_ROOT}/prepared.env")"$'\n' = "${stamp}" ]; then
    echo "$(date +%T) prepare: ${DATA_ROOT} was prepared with these settings (prepared.env): kept" \
      "(delete that file to prepare again)"
    return 0
  fi
  rm -f "${DATA_ROOT}/prepared.env"
  "${prepare}"
  mkdir -p "${DATA_ROOT}"
  printf '%s' "${stamp}" >"${DATA_ROOT}/prepared.env"
}

# lightest_gpu: the GPU that seeds_on_gpus gives the fewest of SEEDS (the first where they divide evenly), where
# the rows without training run beside the seeds
lightest_gpu() {
  local gpus seeds=(${SEEDS})
  read -r -a gpus <<<"$(recipe_gpus)"
  echo "${gpus[${#seeds[@]} % ${#gpus[@]}]}"
}

# seeds_on_gpus SCRIPT LOG_DIR [ARGS]: `SEED=s bash SCRIPT seed ARGS` for every s of SEEDS at once, on the GPUs of
# CUDA_VISIBLE_DEVICES (else the machine's) in turn, at most SEEDS_PER_GPU (1) a GPU (shared_gpu_defaults),
# logged to LOG_DIR/seed_s.log; fails if any seed failed
seeds_on_gpus() {
  local script=$1 logs=$2 seeds=(${SEEDS}) gpus pids=() i status=0 per_gpu=${SEEDS_PER_GPU:-1}
  shift 2
  read -r -a gpus <<<"$(recipe_gpus)"
  if (( ${#seeds[@]} > ${#gpus[@]} * per_gpu )); then
    echo "$(basename "${script}"): ${#seeds[@]} seeds (SEEDS) for ${#gpus[@]} GPU(s) at SEEDS_PER_GPU=${per_gpu}:" \
      "at most $(( ${#gpus[@]} * per_gpu ))" >&2
    return 2
  fi
  mkdir -p "${logs}"
  for i in "${!seeds[@]}"; do
    CUDA_VISIBLE_DEVICES=${gpus[i % ${#gpus[@]}]} SEED=${seeds[i]} bash "${script}" seed "$@" \
      >"${logs}/seed_${seeds[i]}.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || { echo "seed ${seeds[i]} failed: ${logs}/seed_${seeds[i]}.log" >&2; status=1; }
  done
  return "${status}"
}
