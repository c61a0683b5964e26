"""A plug-in's own settings from ``args``: each field ``name`` of a settings dataclass read from the
``--custom-config-path`` key ``<prefix><name>`` where the file has it (the dataclass's default where not), so
that one YAML file holds several plug-ins' settings side by side (``mem_chunk_tokens``, ``memup_top_k``)."""

from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")


def settings_from_args(cls: type[T], args, prefix: str) -> T:
    """``cls`` (a dataclass) filled from ``args``' attributes ``<prefix><field>``."""
    given = vars(args)
    return cls(**{f.name: given[prefix + f.name] for f in fields(cls) if prefix + f.name in given})
