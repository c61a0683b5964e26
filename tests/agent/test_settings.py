"""settings_from_args: a plug-in's dataclass from its prefixed --custom-config-path keys."""

import argparse
from dataclasses import dataclass

from vime_ext.agent.settings import settings_from_args


@dataclass(frozen=True)
class Knobs:
    size: int = 3
    name: str = "a"


def test_prefixed_keys_fill_fields_and_the_rest_keep_defaults():
    args = argparse.Namespace(knob_size=7, other_name="b", knob_unknown=1)
    assert settings_from_args(Knobs, args, "knob_") == Knobs(size=7, name="a")
    assert settings_from_args(Knobs, args, "other_") == Knobs(size=3, name="b")
