"""vime_ext: RL post-training of LLMs with Megatron-core actors and vLLM rollouts."""

__version__ = "0.1.0"
