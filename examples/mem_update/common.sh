#!/usr/bin/env bash
# Shared by the MemUpdate scripts: paths, settings with their defaults, the plug-in flags.
MEM_UPDATE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../../_common.sh
source "${MEM_UPDATE_DIR}/../../_common.sh"
cd "${VIME_EXT_ROOT}"  # plug-ins are named examples.mem_update.*: the launch directory is the repository root

MEMUP_CONFIG=${MEMUP_CONFIG:-${MEM_UPDATE_DIR}/mem_update.yaml}
MEMUP_PLUGIN_ARGS=(
  --custom-generate-function-path examples.mem_update.rollout.generate
  --custom-rm-path examples.mem_update.reward.reward
  --custom-config-path "${MEMUP_CONFIG}"
  --input-key prompt --label-key label --metadata-key metadata
)
