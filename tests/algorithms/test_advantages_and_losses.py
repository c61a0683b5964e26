"""Advantages and losses against values computed by hand."""

import math

import pytest
import torch

from vime_ext.algorithms.advantages import gae_advantages, grpo_advantages, terminal_rewards, whiten
from vime_ext.algorithms.losses import (
    aggregate,
    cispo_policy_loss,
    clipped_policy_loss,
    gspo_policy_loss,
    clipped_value_loss,
    entropy_from_logits,
    kl_penalty,
    rollout_correction_weights,
)


def test_grpo_group_of_four():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    # group 1: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866025
    adv = grpo_advantages(rewards, group_size=4, eps=0.0)
    assert torch.allclose(adv[:4], torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards: no signal, no NaN
    assert torch.allclose(grpo_advantages(rewards, 4, normalize_std=False)[:4], torch.tensor([.5, -.5, -.5, .5]))
    with pytest.raises(ValueError, match="whole groups of 3"):
        grpo_advantages(rewards, group_size=3)


def test_kl_variants():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])  # log r = 0.5, -1.0
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([0.5, -1.0]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), torch.tensor([0.125, 0.5]))
    k3 = torch.tensor([math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1])  # 0.106531, 0.718282
    assert torch.allclose(kl_penalty(logp, ref, "k3"), k3)
    assert torch.allclose(kl_penalty(torch.tensor([-20.0]), torch.tensor([0.0]), "low_var_kl"), torch.tensor([10.0]))
    with pytest.raises(ValueError, match="unknown KL type"):
        kl_penalty(logp, ref, "k4")


def test_clip_higher():
    old = torch.zeros(3)
    logp = torch.log(torch.tensor([1.3, 1.3, 0.7]))  # ratios 1.3, 1.3, 0.7
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, clipped = clipped_policy_loss(logp, old, adv, eps_clip=0.2, eps_clip_high=0.28)
    # A>0, ratio 1.3 > 1.28: clipped at 1.28 -> -1.28; A<0, ratio 0.7 < 0.8: max(0.7, 0.8) -> 0.8
    assert torch.allclose(loss, torch.tensor([-1.28, -1.28, 0.8]))
    assert clipped.tolist() == [1.0, 1.0, 1.0]
    loss_sym, _ = clipped_policy_loss(logp, old, adv, eps_clip=0.2)
    assert torch.allclose(loss_sym, torch.tensor([-1.2, -1.2, 0.8]))
    inside, clipped_inside = clipped_policy_loss(torch.log(torch.tensor([1.1])), torch.zeros(1), torch.ones(1), 0.2)
    assert torch.allclose(inside, torch.tensor([-1.1])) and clipped_inside.item() == 0.0


def test_aggregation_modes_honour_masks():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate(values, mask, "token_mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate(values, mask, "seq_mean_token_mean").item() == pytest.approx((2.0 + 4.0) / 2)
    assert aggregate(values, mask, "seq_mean_token_sum").item() == pytest.approx((6.0 + 4.0) / 2)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(values, mask, "sum")


def test_truncated_is_and_entropy():
    w = rollout_correction_weights(torch.log(torch.tensor([0.5, 0.9])), torch.log(torch.tensor([0.25, 0.9])),
                                   torch.ones(2), 1.5)
    assert torch.allclose(w, torch.tensor([1.5, 1.0]))  # ratio 2 capped at 1.5; equal -> 1
    uniform = entropy_from_logits(torch.zeros(1, 4))
    assert torch.allclose(uniform, torch.tensor([math.log(4)]))


def test_gae_by_hand():
    # Prompt token, 3 generated tokens, padding; reward 1 on the last generated token; gamma 0.9, lambda 0.5.
    mask = torch.tensor([[0, 1, 1, 1, 0]])
    values = torch.tensor([[9.0, 0.5, 0.6, 0.8, 9.0]])
    rewards = terminal_rewards(torch.tensor([1.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 1.0, 0.0]]
    adv, ret = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    # t=3: 1 - 0.8 = 0.2; t=2: 0.9*0.8 - 0.6 + 0.45*0.2 = 0.21; t=1: 0.9*0.6 - 0.5 + 0.45*0.21 = 0.1345
    assert torch.allclose(adv, torch.tensor([[0.0, 0.1345, 0.21, 0.2, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.0, 0.6345, 0.81, 1.0, 0.0]]), atol=1e-6)


def test_gae_skips_unmasked_gaps_and_empty_rows():
    # A tool result (mask 0) between two generated tokens is not a step: token 0 bootstraps from token 2's
    # value. With gamma = lambda = 1 every return is the final reward.
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    values = torch.tensor([[0.5, 7.0, 0.25], [1.0, 1.0, 1.0]])
    rewards = terminal_rewards(torch.tensor([1.0, 3.0]), mask)
    assert rewards.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]  # a row with no generated token gets nothing
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.0, 0.75], [0.0, 0.0, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="equal"):
        gae_advantages(rewards, values[:, :2], mask, 1.0, 1.0)


def test_whiten_uses_batch_wide_moments():
    values, mask = torch.tensor([[1.0, 2.0, 3.0, 100.0]]), torch.tensor([[1, 1, 1, 0]])
    std = math.sqrt(14 / 3 - 4)
    assert torch.allclose(whiten(values, mask, (3.0, 6.0, 14.0)), torch.tensor([[-1 / std, 0.0, 1 / std, 0.0]]))
    # Moments of a larger batch (as summed over micro-batches and ranks) decide the mean and scale.
    assert torch.allclose(whiten(values, mask, (6.0, 12.0, 28.0)), whiten(values, mask, (3.0, 6.0, 14.0)))


def test_clipped_value_loss():
    values, old, returns = torch.tensor([1.0, 0.0, 0.6]), torch.tensor([0.5, 0.5, 0.5]), torch.tensor([2.0, 0.0, 2.0])
    loss, clipped = clipped_value_loss(values, old, returns, value_clip=0.2)
    # row 0: v_clip = 0.7 -> max(1, 1.69) / 2; row 1: v_clip = 0.3 -> max(0, 0.09) / 2; row 2: inside the range
    assert torch.allclose(loss, torch.tensor([0.845, 0.045, 0.98]))
    assert clipped.tolist() == [1.0, 1.0, 0.0]
    unclipped, none = clipped_value_loss(values, old, returns, value_clip=None)
    assert torch.allclose(unclipped, torch.tensor([0.5, 0.0, 0.98])) and none.sum() == 0


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("floor", [None, 0.5])
def test_rollout_correction_matches_verl(level, floor):
    """Token and sequence truncated importance weights, and the IcePop band ([floor, cap], zero outside), against
    verl's rollout correction on random log-probs with a padded mask (verl: a test-only dependency)."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 9, generator=generator) * 3
    rollout = old + torch.randn(6, 9, generator=generator) * (0.2 if level == "sequence" else 0.5)
    mask = (torch.rand(6, 9, generator=generator) > 0.2).float()
    mask[5] = 0.0  # a row without trained tokens
    cap = 2.0 if floor is None else 1.5
    ours = rollout_correction_weights(old, rollout, mask, cap, level, floor)
    theirs, _ = compute_rollout_correction_weights(old - rollout, mask, rollout_is=level,
                                                   rollout_is_threshold=cap if floor is None else f"{floor}_{cap}")
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-6)
    if floor is not None:  # the band masked some tokens and kept others
        assert 0 < int(((ours == 0) & (mask > 0)).sum()) < int(mask.sum())


class _VerlActorConfig(dict):
    """The fields of verl's actor config that its vanilla policy loss reads."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.__dict__.update(fields)


@pytest.mark.parametrize("eps_clip_c", [None, 3.0])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_ppo_clip_higher_and_dual_clip_match_verl(eps_clip_c, mode):
    """PPO's clipped loss with clip-higher and, with --eps-clip-c, dual-clip, aggregated each way, against verl's
    vanilla policy loss on random log-probs and advantages of both signs (ratios far from 1, so every branch
    is taken)."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    generator = torch.Generator().manual_seed(1)
    old = -torch.rand(5, 7, generator=generator) * 2
    new = old + torch.randn(5, 7, generator=generator) * 1.5
    advantages = torch.randn(5, 7, generator=generator)
    mask = (torch.rand(5, 7, generator=generator) > 0.25).float()
    per_token, _ = clipped_policy_loss(new, old, advantages, 0.2, 0.28, eps_clip_c)
    config = _VerlActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28,
                              clip_ratio_c=eps_clip_c if eps_clip_c is not None else 1e9, global_batch_info={})
    theirs, _ = compute_policy_loss_vanilla(old, new, advantages, mask, mode.replace("_", "-"), config)
    assert aggregate(per_token, mask, mode).item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-7)
    if eps_clip_c is not None:  # dual-clip bit somewhere
        plain, _ = clipped_policy_loss(new, old, advantages, 0.2, 0.28)
        assert (per_token < plain).any()


@pytest.mark.parametrize("loss", ["gspo", "cispo"])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_gspo_and_cispo_match_verl_in_value_and_gradient(loss, mode):
    """GSPO (sequence ratios, the paper's clip scale) and CISPO (clipped ratio without gradient), aggregated each
    way: the loss and its gradient with respect to the log-probs equal verl's."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_cispo, compute_policy_loss_gspo
    from verl.workers.config.actor import ActorConfig

    generator = torch.Generator().manual_seed(2)
    old = -torch.rand(5, 7, generator=generator) * 2
    start = old + torch.randn(5, 7, generator=generator) * (0.001 if loss == "gspo" else 0.5)
    advantages = torch.randn(5, 1, generator=generator).expand(5, 7)
    mask = (torch.rand(5, 7, generator=generator) > 0.25).float()
    low, high = (3e-4, 4e-4) if loss == "gspo" else (0.2, 0.28)
    ours_new, theirs_new = start.clone().requires_grad_(True), start.clone().requires_grad_(True)
    if loss == "gspo":
        per_token, clipped = gspo_policy_loss(ours_new, old, advantages, mask, low, high)
    else:
        per_token, clipped = cispo_policy_loss(ours_new, old, advantages, low, high)
    ours = aggregate(per_token, mask, mode)
    config = ActorConfig(strategy="fsdp", clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
                         ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, rollout_n=1)
    reference = compute_policy_loss_gspo if loss == "gspo" else compute_policy_loss_cispo
    theirs, _ = reference(old, theirs_new, advantages, mask, mode.replace("_", "-"), config)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-7)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours_new.grad, theirs_new.grad, rtol=1e-5, atol=1e-7)
    assert 0 < float((clipped * mask).sum()) < float(mask.sum())  # both branches taken
