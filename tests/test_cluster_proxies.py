"""The driver calls trainer ranks and the rollout manager through typed proxies (vime_ext/cluster.py) whose
method names travel to Ray actors as strings: every proxy method must exist on the class it stands for, with
the same parameters and defaults, or a renamed method would fail only in a run."""

import inspect

import pytest

from vime_ext.driver.cluster import RolloutManagerHandle, TrainerRanks
from vime_ext.driver.rollout_manager import RolloutManager
from vime_ext.trainer.actor import TrainActor


def public_methods(cls) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(cls).items()
            if callable(fn) and not name.startswith("_")}


def parameters(signature: inspect.Signature) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in signature.parameters.values() if p.name != "self"]


@pytest.mark.parametrize("proxy,real", [(TrainerRanks, TrainActor), (RolloutManagerHandle, RolloutManager)])
def test_every_proxy_method_is_the_real_ones(proxy, real):
    mine, theirs = public_methods(proxy), public_methods(real)
    assert mine, proxy
    missing = sorted(set(mine) - set(theirs))
    assert not missing, f"{proxy.__name__} calls {missing}, which {real.__name__} does not have"
    for name, signature in mine.items():
        assert parameters(signature) == parameters(theirs[name]), (
            f"{proxy.__name__}.{name}{signature} differs from {real.__name__}.{name}{theirs[name]}")


def test_the_check_names_a_renamed_method():
    methods = {k: v for k, v in vars(TrainActor).items() if k != "memory"}
    Renamed = type("Renamed", (), {**methods, "memory_report": TrainActor.memory})
    with pytest.raises(AssertionError, match=r"calls \['memory'\], which Renamed does not have"):
        test_every_proxy_method_is_the_real_ones(TrainerRanks, Renamed)


class _Rank:
    def __init__(self, rank: int):
        self.rank = rank

    def eval_loss(self, sequences):
        return (self.rank, sequences)

    def memory(self):
        return {"rank": self.rank}


def test_per_rank_calls_give_each_rank_its_share_and_keep_rank_order():
    ranks = TrainerRanks([_Rank(0), _Rank(1), _Rank(2)], use_ray=False)
    assert ranks.eval_loss([["a"], ["b"], ["c"]]) == [(0, ["a"]), (1, ["b"]), (2, ["c"])]
    assert ranks.memory() == [{"rank": 0}, {"rank": 1}, {"rank": 2}] and len(ranks) == 3
