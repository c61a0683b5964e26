"""Qwen2 / Qwen2.5: biases on q, k and v projections only."""

from vime_ext.convert.mapping import Family

FAMILY = Family(name="qwen2", qkv_bias=True)
