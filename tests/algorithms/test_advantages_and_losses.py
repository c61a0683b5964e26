"""Advantages and losses against values computed by hand."""

import math

import pytest
import torch

from vime_ext.algorithms.advantages import grpo_advantages
from vime_ext.algorithms.losses import (
    aggregate,
    clipped_policy_loss,
    entropy_from_logits,
    kl_penalty,
    truncated_importance_weights,
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
    w = truncated_importance_weights(torch.log(torch.tensor([0.5, 0.9])), torch.log(torch.tensor([0.25, 0.9])), 1.5)
    assert torch.allclose(w, torch.tensor([1.5, 1.0]))  # ratio 2 capped at 1.5; equal -> 1
    uniform = entropy_from_logits(torch.zeros(1, 4))
    assert torch.allclose(uniform, torch.tensor([math.log(4)]))
