"""Llama (and SmolLM2, which is a Llama): no biases, no q/k norms; embeddings may be tied."""

from vime_ext.convert.mapping import Family

FAMILY = Family(name="llama")
