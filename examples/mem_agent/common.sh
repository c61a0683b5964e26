#!/usr/bin/env bash
# Shared by the MemAgent scripts: paths, settings with their defaults, and the advantage recipe.
MEM_AGENT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../_common.sh
source "${MEM_AGENT_DIR}/../../_common.sh"
cd "${VIME_EXT_ROOT}"  # plug-ins are named examples.mem_agent.*: the launch directory is the repository root

export MEM_CHUNK_TOKENS=${MEM_CHUNK_TOKENS:-2048} MEM_MAX_MEMORY=${MEM_MAX_MEMORY:-1024}
export MEM_MAX_FINAL=${MEM_MAX_FINAL:-256} MEM_MAX_CHUNKS=${MEM_MAX_CHUNKS:-64}
export MEM_ANSWER_FORMAT=${MEM_ANSWER_FORMAT:-boxed} MEM_ANSWER_PREFIX=${MEM_ANSWER_PREFIX:-}
MEM_CONFIG=${MEM_CONFIG:-${MEM_AGENT_DIR}/mem_agent.yaml}

# GRPO advantage of a trajectory: vime's (reward minus group mean, over the group std, split over the chats)
# or MemAgent's (reward minus group mean, every chat the whole of it).
ADVANTAGE=${ADVANTAGE:-vime}
case "${ADVANTAGE}" in
  vime) ADVANTAGE_ARGS=(--trajectory-advantage split) ;;
  memagent) ADVANTAGE_ARGS=(--trajectory-advantage shared --disable-grpo-std-normalization) ;;
  *) echo "ADVANTAGE=${ADVANTAGE}: choose vime or memagent" >&2; exit 2 ;;
esac

MEM_PLUGIN_ARGS=(
  --custom-generate-function-path examples.mem_agent.rollout.generate
  --custom-rm-path examples.mem_agent.reward.reward
  --custom-config-path "${MEM_CONFIG}"
  --input-key prompt --label-key label --metadata-key metadata
)
