"""Rollout flags (slime/vime names) and the typed config they fill."""

import argparse
from dataclasses import dataclass

from vime_ext.flags import add_dataclass_flags, dataclass_from_args
from vime_ext.rollout.protocol import SamplingParams


@dataclass(frozen=True)
class RolloutConfig:
    rollout_batch_size: int = 8  # prompts per rollout
    n_samples_per_prompt: int = 4  # group size (GRPO)
    rollout_max_response_len: int = 1024
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_stop: tuple[str, ...] = ()
    rollout_seed: int | None = None
    custom_generate_function_path: str = "vime_ext.rollout.generate.generate"
    custom_rm_path: str = "vime_ext.rollout.rewards.boxed_exact_match"
    rollout_function_path: str = "vime_ext.rollout.rollout.generate_rollout"
    custom_convert_samples_to_train_data_path: str | None = None

    def __post_init__(self):
        for name in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        self.sampling_params().validate()

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.rollout_temperature, top_p=self.rollout_top_p,
                              max_new_tokens=self.rollout_max_response_len, stop=self.rollout_stop,
                              seed=self.rollout_seed)

    @classmethod
    def add_args(cls, parser: argparse.ArgumentParser) -> None:
        add_dataclass_flags(parser, cls, "rollout")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RolloutConfig":
        return dataclass_from_args(cls, args)
