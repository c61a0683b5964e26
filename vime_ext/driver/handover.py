"""The weights and the GPUs between the trainer ranks and the engines, as the driver sees them: push a version,
hand the GPUs to one side or the other (the policy of each sharing mode is ``vime_ext/gpu_sharing.py``'s), and
restart an engine that died so that it serves the current weights, never the starting ones."""

import threading
import time
from collections import deque
from collections.abc import Callable

from tqdm import tqdm

from vime_ext.driver.cluster import Cluster

WEIGHT_BUCKET_BYTES = 512 * 2**20
# The trainer's GPU memory left after a hand-over grows at every one of this many steps in a row, by at least
# GROWTH_GIB each time: something keeps memory per step, and the engines will not wake once it fills the GPU.
GROWTH_STEPS = 2
GROWTH_GIB = 0.25


class ReleaseWatch:
    """The trainer ranks' memory left on the GPU after each hand-over to the engines (``released_allocated_gb``,
    the largest over the ranks). It should be the same every step; a leak shows as steady growth long before the
    engines run out of room to wake (the two-engine IPC push kept a copy of the weights per step this way:
    52.5, 60.0, 67.5 GiB at Qwen3-4B's shape, then out of memory, records/peers_w2_h200_run3)."""

    def __init__(self, steps: int = GROWTH_STEPS, floor_gib: float = GROWTH_GIB):
        self.steps, self.floor_gib = steps, floor_gib
        self.last: deque[float] = deque(maxlen=steps + 1)  # the hand-overs the test looks at, no more

    def add(self, memory: dict[str, float]) -> str | None:
        """Record one hand-over's figures; a warning when the memory left has grown ``steps`` times in a row."""
        if "released_allocated_gb" not in memory:
            return None
        self.last.append(memory["released_allocated_gb"])
        last = list(self.last)
        if len(last) <= self.steps or any(b - a < self.floor_gib for a, b in zip(last, last[1:])):
            return None
        return (f"the trainer's GPU memory left after the hand-over grew at each of the last {self.steps} steps "
                f"({', '.join(f'{gb:.2f}' for gb in last)} GiB): something keeps GPU memory every step, and the "
                "engines will run out of room to wake")


class HandOver:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.sharing = cluster.sharing
        self.manager = cluster.manager if cluster.has_engines else None
        # Held while the engines generate, take weights or evaluate: with --async-training a rollout runs beside
        # training, and the weights must not change inside one.
        self.lock = threading.Lock()
        self.pushed: Callable[[int], None] | None = None  # told each version the engines hold (the async producer)
        self.watch = ReleaseWatch()

    @property
    def both_sides(self) -> bool:
        """Engines and trainer ranks both run (not SFT, nor a debug run with one side only)."""
        return self.cluster.has_engines and self.cluster.has_actors

    def push_weights(self, version: int) -> float:
        """The trainer ranks' weights to every engine as ``version``; an engine that dies mid-push is restarted and
        the push tried once more. Returns its seconds."""
        if not self.both_sides:
            return 0.0
        start, manager = time.perf_counter(), self.manager
        with self.lock:  # between two rollouts, or (--partial-rollout) pausing the one in flight
            for attempt in range(2):
                try:
                    manager.begin_weight_update()  # restarts an engine that died since the last one
                    self.cluster.ranks.push_weights(manager.weight_target(), WEIGHT_BUCKET_BYTES)
                    manager.finish_weight_update(version)
                    break
                except Exception as err:  # noqa: BLE001 (an engine that died mid-push; anything else goes on up)
                    if attempt or not manager.dead_engines(wait_s=10):
                        raise
                    tqdm.write(f"an engine died during the weight push ({type(err).__name__}); restarting it and "
                               "pushing again")
        if self.pushed is not None:
            self.pushed(version)
        return time.perf_counter() - start

    def to_trainer(self, times: dict[str, float], memory: dict[str, float]) -> None:
        """The GPUs to the trainer ranks (colocated: the engines sleep)."""
        self.sharing.to_trainer(self.cluster.ranks, self.manager, times, memory)

    def to_engines(self, version: int, times: dict[str, float], memory: dict[str, float]) -> None:
        """The weights of ``version`` to the engines, and the GPUs with them (colocated: woken around the push)."""
        self.sharing.to_engines(lambda: self.push_weights(version), self.cluster.ranks, self.manager, times, memory)
        warning = self.watch.add(memory)
        if warning:
            tqdm.write(warning)

    def round_trip(self, version: int, times: dict[str, float], memory: dict[str, float]) -> None:
        """To the trainer and back with ``version``: after a load, a restart, or a healed engine."""
        self.to_trainer(times, memory)
        self.to_engines(version, times, memory)

    def heal_engines(self, version: int, times: dict[str, float], memory: dict[str, float]) -> None:
        """An engine that died since the last weight push (during training, say) is restarted and given the
        current weights before the next rollout. Colocated, the round trip through the trainer side puts every
        engine to sleep (restarting the dead one while the memory is the engines') and wakes them around the
        push."""
        if not self.both_sides or not self.manager.dead_engines():
            return
        tick = time.perf_counter()
        self.round_trip(version, times, memory)
        times["engine_restart"] = time.perf_counter() - tick
