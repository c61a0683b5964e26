"""Samples -> training sequences -> data-parallel shares -> micro-batches, and the per-step loss weights."""

import pytest
import torch

from vime_ext.agent.sample import Sample, Status, Turn
from vime_ext.algorithms.losses import aggregate, token_weights
from vime_ext.algorithms.train_data import TrainSequence, compute_advantages, samples_to_train_data
from vime_ext.trainer.batching import micro_batches, split_data_parallel
from vime_ext.trainer.packing import next_tokens, to_rows


def sample(index, prompt_len, response, reward, status=Status.COMPLETED, turns=()):
    return Sample(prompt="p", index=index, group_index=index // 2, tokens=list(range(1, prompt_len + 1)) + response,
                  response_length=len(response), loss_mask=[1] * len(response),
                  rollout_log_probs=[-0.5] * len(response), reward=reward, status=status, turns=list(turns))


def test_sequences_align_masks_with_targets_and_share_the_trajectory_advantage():
    turn = Turn(tokens=[7, 8, 9, 10], loss_mask=[1, 0], rollout_log_probs=[-1.0, 0.0])
    samples = [sample(0, 3, [20, 21], 1.0, turns=[turn]), sample(1, 3, [30], 0.0),
               sample(2, 2, [], None, status=Status.FAILED), sample(3, 2, [40], 1.0)]
    advantages = compute_advantages(samples, group_size=2)
    # Group (0, 1): rewards 1, 0; group (2, 3): the failed sample counts as reward 0.
    assert advantages.tolist() == pytest.approx([0.7071, -0.7071, -0.7071, 0.7071], abs=1e-3)
    sequences = samples_to_train_data(grpo_args(2), samples)
    assert [s.sample_index for s in sequences] == [0, 0, 1, 3]  # the failed sample trains on nothing
    main, extra = sequences[0], sequences[1]
    # tokens [1, 2, 3, 20, 21]: targets [2, 3, 20, 21]; only the response targets are trained.
    assert main.loss_mask == [0, 0, 1, 1] and main.rollout_log_probs == [0.0, 0.0, -0.5, -0.5]
    # The turn's last token (a tool's answer, mask 0) is cut: no trained token depends on it.
    assert extra.tokens == [7, 8, 9] and extra.loss_mask == [0, 1] and extra.rollout_log_probs == [0.0, -1.0]
    assert [s.advantage for s in sequences] == pytest.approx(advantages[[0, 0, 1, 3]].tolist())
    # split: the two sequences of trajectory 0 carry half its advantage each; one-sequence trajectories all of it.
    split = samples_to_train_data(grpo_args(2, "split"), samples)
    a = advantages.tolist()
    assert [s.advantage for s in split] == pytest.approx([a[0] / 2, a[0] / 2, a[1], a[3]])


def grpo_args(group_size: int, trajectory_advantage: str = "shared"):
    from vime_ext.rollout.plugins import PluginArgs

    return PluginArgs(advantage_estimator="grpo", loss_type="policy_loss", n_samples_per_prompt=group_size,
                      disable_grpo_std_normalization=False, trajectory_advantage=trajectory_advantage)


def test_an_episode_over_the_token_budget_only_by_its_last_tool_answer_still_trains():
    # An episode bounded at 12 tokens: prompt 4, reply 6, then the last call's answer (4 tokens, mask 0) takes
    # it to 14. Micro-batches of 12 tokens (the episode's bound) hold it, cut after the reply, log-probs kept.
    episode = Sample(prompt="p", index=0, group_index=0, tokens=list(range(1, 15)), response_length=10,
                     loss_mask=[1] * 6 + [0] * 4, rollout_log_probs=[-0.25] * 6 + [0.0] * 4, reward=1.0,
                     status=Status.COMPLETED)
    other = sample(1, 4, [5, 6], 0.0)
    sequences = samples_to_train_data(grpo_args(2), [episode, other])
    assert sequences[0].tokens == list(range(1, 11))
    assert sequences[0].loss_mask == [0, 0, 0] + [1] * 6 and sum(sequences[0].rollout_log_probs) == -1.5
    assert sum(b.tokens.shape[0] for b in micro_batches(sequences, max_tokens=12)) == 2


def test_completed_sample_without_reward_is_an_error():
    with pytest.raises(ValueError, match="has no reward"):
        compute_advantages([sample(0, 2, [5], None), sample(1, 2, [6], 1.0)], group_size=2)


def seq(n, index=0):
    return TrainSequence(list(range(n)), [1] * (n - 1), [-1.0] * (n - 1), 0.5, index)


def test_data_parallel_split_balances_tokens_and_keeps_order():
    sequences = [seq(n, i) for i, n in enumerate([10, 3, 8, 4, 6, 5])]
    shares = split_data_parallel(sequences, 2)
    assert sorted(s.sample_index for share in shares for s in share) == list(range(6))
    loads = [sum(len(s.tokens) for s in share) for share in shares]
    assert abs(loads[0] - loads[1]) <= 2
    for share in shares:
        assert [s.sample_index for s in share] == sorted(s.sample_index for s in share)


def test_micro_batches_pad_right_and_respect_a_token_budget():
    sequences = [seq(n, i) for i, n in enumerate([5, 3, 9, 4])]
    fixed = micro_batches(sequences, micro_batch_size=2)
    assert [tuple(b.tokens.shape) for b in fixed] == [(2, 5), (2, 9)]
    assert fixed[0].tokens[1].tolist() == [0, 1, 2, 0, 0] and fixed[0].loss_mask[1].tolist() == [1, 1, 0, 0]
    assert fixed[0].advantages[1].tolist() == [0.5, 0.5, 0.0, 0.0]
    dynamic = micro_batches(sequences, max_tokens=12)
    assert all(b.num_tokens <= 12 for b in dynamic)
    assert sum(b.tokens.shape[0] for b in dynamic) == 4
    with pytest.raises(ValueError, match="exceeds --max-tokens-per-gpu"):
        micro_batches(sequences, max_tokens=8)


def test_packed_micro_batches_lay_sequences_end_to_end_and_scatter_back_to_rows():
    sequences = [seq(n, i) for i, n in enumerate([5, 3, 9, 4])]
    # The budget counts packed tokens: 3+4+5 = 12 fits in 12, where padded rows would need 3 x 5 = 15.
    batches = micro_batches(sequences, max_tokens=12, pack_multiple=1)
    assert [b.rows for b in batches] == [[1, 3, 0], [2]]
    first = batches[0]
    assert first.num_tokens == 12 and tuple(first.tokens.shape) == (3, 5)
    packing = first.packing
    assert packing.input_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]]
    assert packing.position_ids.tolist() == packing.input_ids.tolist()  # each sequence counts from 0
    assert packing.cu_seqlens.tolist() == [0, 3, 7, 12] and packing.max_seqlen == 5
    # next_tokens runs over the pack; to_rows puts each position back in its row, zeros past a row's end.
    targets = next_tokens(first.tokens, packing)
    assert targets.tolist() == [1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4, 0]
    rows = to_rows(targets.float(), first.tokens, packing)
    assert rows.tolist() == [[1, 2, 0, 0, 0], [1, 2, 3, 0, 0], [1, 2, 3, 4, 0]]
    # Aligned to a multiple of 8 (sequence parallelism): the padding is a segment of its own, dropped by to_rows.
    aligned = micro_batches(sequences, max_tokens=14, pack_multiple=8)
    assert all(b.num_tokens % 8 == 0 for b in aligned)
    assert aligned[0].packing.cu_seqlens.tolist() == [0, 3, 7, 8] and aligned[0].rows == [1, 3]
    values = torch.arange(8.0, requires_grad=True)
    back = to_rows(values, aligned[0].tokens, aligned[0].packing)
    assert back.tolist() == [[0, 1, 2, 0], [3, 4, 5, 6]]
    back.sum().backward()
    assert values.grad.tolist() == [1] * 7 + [0]  # the gradient reaches packed tokens, not the padding


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_token_weights_split_over_micro_batches_sum_to_the_whole_batch_aggregate(mode):
    torch.manual_seed(0)
    values = torch.randn(6, 7)
    mask = (torch.rand(6, 7) > 0.3).float()
    mask[:, 0] = 1
    whole = aggregate(values, mask, mode)
    total_tokens, total_seqs = mask.sum().item(), 6
    parts = sum((values[i:i + 2] * token_weights(mask[i:i + 2], mode, total_tokens, total_seqs)).sum()
                for i in range(0, 6, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)
