"""Qwen3 (dense): per-head RMSNorm on q and k, no biases."""

from vime_ext.convert.mapping import Family

FAMILY = Family(name="qwen3", qk_norm=True)
