"""vime_ext: RL post-training of LLMs with Megatron-core actors and vLLM rollouts."""

__version__ = "0.1.0"

from vime_ext import quiet as _quiet

_quiet.install()  # known-harmless library warnings (vime_ext/quiet.py says why each is)
