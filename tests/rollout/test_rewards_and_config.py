import argparse

import pytest

from vime_ext.agent.rewards import boxed_exact_match, last_boxed, overlong_penalty
from vime_ext.agent.sample import Sample, Status
from vime_ext.arguments import parse_train_args, rollout_problems
from vime_ext.data.synthetic import write_jsonl
from vime_ext.rollout.config import RolloutConfig, sampling_params
from vime_ext.rollout.plugins import load_function
from vime_ext.rollout.rollout import penalize_overlong, rollout_metrics


def test_last_boxed_handles_nesting_and_absence():
    assert last_boxed(r"so \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert last_boxed("no box here") is None
    assert last_boxed(r"\boxed{unclosed") is None


@pytest.mark.parametrize("response,label,reward", [
    (r"The answer is \boxed{Paris}.", "paris", 1.0),
    (r"\boxed{ 3.0 }", "3", 1.0),
    (r"\boxed{\text{Yes}}", ["yes", "true"], 1.0),
    (r"\boxed{4}", "5", 0.0),
])
def test_boxed_exact_match(response, label, reward):
    sample = Sample(prompt="q", response=response, label=label)
    assert boxed_exact_match(None, sample) == reward and sample.metadata["no_boxed"] is False


def test_missing_boxed_scores_zero_and_is_flagged():
    sample = Sample(prompt="q", response="Paris", label="Paris")
    assert boxed_exact_match(None, sample) == 0.0 and sample.metadata["no_boxed"] is True


def test_config_from_flags_and_refusals(tiny_hf_dirs, tmp_path):
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 4)
    config = parse_train_args(["--hf-checkpoint", str(tiny_hf_dirs["llama"]), "--prompt-data", str(data),
                               "--n-samples-per-prompt", "8",
                               "--rollout-temperature", "0.7", "--rollout-stop", "</answer>"]).rollout
    assert config.n_samples_per_prompt == 8 and config.rollout_stop == ("</answer>",)
    assert sampling_params(config).temperature == 0.7
    flags = ["--hf-checkpoint", str(tiny_hf_dirs["llama"]), "--prompt-data", str(data)]
    with pytest.raises(ValueError, match="--n-samples-per-prompt must be at least 1"):
        parse_train_args([*flags, "--n-samples-per-prompt", "0"])
    with pytest.raises(ValueError, match="top_p=1.5"):
        parse_train_args([*flags, "--rollout-top-p", "1.5"])


def test_dotted_paths_fail_with_the_flag_name():
    assert load_function("vime_ext.agent.rewards.boxed_exact_match", "--custom-rm-path") is boxed_exact_match
    with pytest.raises(ValueError, match="--custom-rm-path='nodots': expected a dotted path"):
        load_function("nodots", "--custom-rm-path")
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_pkg'.*Python looked in \["):
        load_function("no_such_pkg.f", "--custom-rm-path")
    with pytest.raises(ValueError, match="has no callable 'nope'"):
        load_function("vime_ext.agent.rewards.nope", "--custom-rm-path")


def test_console_scripts_are_found_beside_the_running_python(monkeypatch):
    """A venv's python run without activating the venv still finds the venv's vllm-router."""
    import sys
    from pathlib import Path

    from vime_ext.engines.servers import installed_program

    monkeypatch.setenv("PATH", "/nonexistent")
    assert installed_program("vllm-router") == str(Path(sys.executable).parent / "vllm-router")
    with pytest.raises(FileNotFoundError, match="no-such-program: not in .* nor on PATH"):
        installed_program("no-such-program")


def test_overlong_penalty_is_dapos_linear_ramp():
    """--overlong-buffer-len 4 with 16-token responses: no penalty up to 12 tokens, then -1/4 per token x the
    factor, -factor at the limit; added to the reward and logged per sample."""
    assert [overlong_penalty(n, 16, 4, 0.5) for n in (3, 12, 13, 14, 16)] == [0.0, 0.0, -0.125, -0.25, -0.5]
    args = argparse.Namespace(overlong_buffer_len=4, overlong_penalty_factor=1.0, rollout_max_response_len=16)
    long, short = Sample(prompt="q", response_length=15, reward=1.0), Sample(prompt="q", response_length=5, reward=1.0)
    for sample in (long, short):
        penalize_overlong(args, sample)
    assert (long.reward, long.metrics["overlong_penalty"]) == (0.25, -0.75) and short.reward == 1.0
    assert rollout_problems(RolloutConfig(rollout_max_response_len=16, overlong_buffer_len=20)) == [
        "--overlong-buffer-len 20 must lie in [1, --rollout-max-response-len 16]"]


def test_overlong_penalty_matches_verls_dapo_reward_manager():
    """The reward after penalize_overlong equals verl's DAPO reward manager's (overlong buffer on) for random
    response lengths, buffers, factors and base rewards (verl: a test-only dependency)."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.workers.reward_manager.dapo import DAPORewardManager

    class Decoder:  # verl decodes the response for its score function; the penalty reads only the length
        eos_token = "</s>"

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(str(int(i)) for i in ids)

    gen = torch.Generator().manual_seed(0)
    for max_len, buffer, factor in ((16, 4, 1.0), (64, 20, 0.5), (32, 32, 2.0)):
        lengths = torch.randint(1, max_len + 1, (12,), generator=gen)
        base = torch.rand(12, generator=gen).tolist()
        prompt_len = 3
        mask = torch.zeros(12, prompt_len + max_len, dtype=torch.long)
        mask[:, :prompt_len] = 1
        for i, n in enumerate(lengths.tolist()):
            mask[i, prompt_len:prompt_len + n] = 1
        data = DataProto.from_dict(
            tensors={"prompts": torch.ones(12, prompt_len, dtype=torch.long),
                     "responses": torch.randint(5, 100, (12, max_len), generator=gen), "attention_mask": mask},
            non_tensors={"data_source": np.array(["gen"] * 12, dtype=object),
                         "reward_model": np.array([{"ground_truth": str(b)} for b in base], dtype=object)})
        manager = DAPORewardManager(
            Decoder(), num_examine=0, compute_score=lambda data_source, solution_str, ground_truth, extra_info:
            float(ground_truth), max_resp_len=max_len,
            overlong_buffer_cfg=OmegaConf.create({"enable": True, "len": buffer, "penalty_factor": factor,
                                                  "log": False}))
        verl_rewards = manager(data).sum(dim=-1)
        args = argparse.Namespace(overlong_buffer_len=buffer, overlong_penalty_factor=factor,
                                  rollout_max_response_len=max_len)
        ours = []
        for n, reward in zip(lengths.tolist(), base):
            sample = Sample(prompt="q", response_length=n, reward=reward)
            penalize_overlong(args, sample)
            ours.append(sample.reward)
        assert ours == pytest.approx(verl_rewards.tolist(), abs=1e-6), (max_len, buffer, factor)
        assert min(ours[i] - base[i] for i in range(12)) < 0  # some lengths were penalized


def test_groups_whose_rewards_are_all_equal_are_counted():
    # Three groups of two: both right, one right, both wrong. Only the middle one gives GRPO an advantage.
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    samples = [Sample(prompt="q", reward=r, group_index=i // 2, index=i, status=Status.COMPLETED)
               for i, r in enumerate(rewards)]
    assert rollout_metrics(samples, "rollout")["rollout/uniform_reward_groups"] == pytest.approx(2 / 3)
    singles = [Sample(prompt="q", reward=1.0, group_index=i, index=i, status=Status.COMPLETED) for i in range(3)]  # nothing to compare
    assert "rollout/uniform_reward_groups" not in rollout_metrics(singles, "eval")
