"""Dynamic-sampling filters (``--dynamic-sampling-filter-path``): ``filter(args, group) -> bool`` keeps a group."""

from vime_ext.algorithms.train_data import scalar_reward


def check_reward_nonzero_std(args, group) -> bool:
    """Keep groups whose rewards differ: in an all-equal group every GRPO advantage is 0, so it trains on
    nothing and only dilutes the step (DAPO's dynamic sampling). Failed samples count as reward 0, as in the
    advantages."""
    rewards = [scalar_reward(s) for s in group]
    return max(rewards) > min(rewards)
