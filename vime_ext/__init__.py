"""vime_ext: RL post-training of LLMs with Megatron-core actors and vLLM rollouts."""

import os

__version__ = "0.1.0"

# A trainer and its engines share the host's cores wherever they run at once (asynchronous training, CPU engines,
# the optimizer on the host): OpenMP threads that spin after each parallel region then take the cores the other
# process needs. On 2 cores, one asynchronous step of SmolLM2-135M took 31 s with spinning threads and 10 s
# without (docs/performance.md). Set before torch loads its OpenMP runtime, which reads it once; every
# process that imports vime_ext first (the driver, Ray workers, engine servers) and every process they start
# inherits it. A value the user sets wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vime_ext import lazy_fusions as _lazy_fusions  # noqa: E402
from vime_ext import quiet as _quiet  # noqa: E402

_quiet.install()  # known-harmless library warnings (vime_ext/quiet.py says why each is)
_lazy_fusions.install()  # megatron's fused kernels compiled on first call, not built at import (about 4 s a process)
