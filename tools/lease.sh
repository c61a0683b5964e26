#!/usr/bin/env bash
# One background job on a lent GPU machine (the `device` tool: a call runs at most 10 minutes, and a machine idle
# for 30 s between calls is given back with every file on it), and the polls that bring its results back while it
# runs, so that a machine lost mid-job has already returned what it had:
#   bash tools/lease.sh start NAME COMMAND...   # COMMAND in the background, detached from the call; its output in
#                                               # LEASE_OUT/NAME.log, GPU memory every 10 s in LEASE_OUT/gpu_mem.log,
#                                               # its exit status in LEASE_OUT/NAME.done when it ends
#   bash tools/lease.sh poll NAME SECONDS [DIR...]  # waits up to SECONDS for the job (return well inside the
#                                               # call's limit), then packs LEASE_OUT and each DIR, without
#                                               # weights, checkpoints, data or saved rollouts (the
#                                               # recipe's readable rollout_replies.jsonl.xz comes), into
#                                               # $OUT/NAME_<time>_<pid>.tgz (the call's folder that comes
#                                               # back) and prints the logs' tails;
#                                               # fact-consolidation episodes (eval_fact/*.samples*: each quotes
#                                               # MemoryAgentBench's context, of unknown licence) stay too
# Poll back to back with long waits (500 s in a call of 600): every gap between two calls is a chance to lose the
# machine; where calls can be queued, queue several polls at once (and the parts before `start`), so that no gap
# waits on the caller. LEASE_OUT defaults to /tmp/lease_out.
set -uo pipefail
LEASE_OUT=${LEASE_OUT:-/tmp/lease_out}

start() {
  local name=${1:?usage: lease.sh start NAME COMMAND...}
  shift
  (( $# )) || { echo "lease.sh start ${name}: no command" >&2; return 2; }
  mkdir -p "${LEASE_OUT}"
  rm -f "${LEASE_OUT}/${name}.done"
  if command -v nvidia-smi >/dev/null && [ ! -f "${LEASE_OUT}/gpu_mem.pid" ]; then
    setsid bash -c 'while true; do echo "$(date +%T) $(nvidia-smi --query-gpu=memory.used,utilization.gpu \
      --format=csv,noheader | tr "\n" " ")"; sleep 10; done' >>"${LEASE_OUT}/gpu_mem.log" 2>&1 </dev/null &
    echo $! >"${LEASE_OUT}/gpu_mem.pid"
  fi
  # setsid: the job outlives the call that started it; the status file is written whatever the exit
  setsid bash -c '"$@" >"$0.log" 2>&1; echo $? >"$0.done"' "${LEASE_OUT}/${name}" "$@" </dev/null >/dev/null 2>&1 &
  echo "$(date +%T) ${name} started (pid $!): ${LEASE_OUT}/${name}.log"
}

poll() {
  local name=${1:?usage: lease.sh poll NAME SECONDS [DIR...]} seconds=${2:?usage: lease.sh poll NAME SECONDS} waited=0
  shift 2
  local out=${OUT:?OUT: the folder whose files come back}
  while [ ! -f "${LEASE_OUT}/${name}.done" ] && (( waited < seconds )); do sleep 5; waited=$(( waited + 5 )); done
  local pack="${out}/${name}_$(date +%H%M%S)_$$.tgz" dirs=("${LEASE_OUT}" "$@") dir rels=()
  for dir in "${dirs[@]}"; do [ -e "${dir}" ] && rels+=("${dir#/}"); done
  tar -czf "${pack}" -C / --exclude='*/data' --exclude='iter_*' --exclude='hf' --exclude='*.safetensors' \
    --exclude='*.distcp' --exclude='*.pt' --exclude='*.pid' --exclude='*/eval_fact/*.samples*' \
    --exclude='*/rl/rollouts' "${rels[@]}" \
    2>/dev/null
  echo "$(date +%T) ${pack}: $(du -h "${pack}" | cut -f1)"
  tail -n 8 "${LEASE_OUT}/${name}.log" 2>/dev/null
  tail -n 2 "${LEASE_OUT}/gpu_mem.log" 2>/dev/null
  if [ -f "${LEASE_OUT}/${name}.done" ]; then
    echo "${name} done: exit $(cat "${LEASE_OUT}/${name}.done")"
  else
    echo "${name} still running after ${waited} s"
  fi
}

case "${1:-}" in
  start) shift; start "$@" ;;
  poll) shift; poll "$@" ;;
  *) echo "usage: lease.sh start NAME COMMAND... | poll NAME SECONDS [DIR...]" >&2; exit 2 ;;
esac
