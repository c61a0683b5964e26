"""Saving, resuming and restarting: what lets a run stop and go on without losing or repeating a step.

- ``save``: the trainer ranks' checkpoint with the data position the next rollout starts from; a failed write
  (a full disk) leaves the last complete checkpoint untouched and says how to resume.
- ``resume``: ``--load``'s checkpoint, else the starting weights.
- ``recover``: a trainer rank died; new ranks load the last complete checkpoint and the run goes on from there.
- ``--exit-duration-in-mins``: the step the run stops after, decided once, so that it is the step it saves.
- ``trained``: the rollouts whose steps the trainer's weights hold, saved with each checkpoint and restored with
  it, so that a run can show that after any restart each rollout was trained once (``train/rollouts_trained_twice``).

A dead engine is healed by the hand-over (``handover.py``), a dead rollout's groups in the loop (``loop.py``).
"""

import shutil
import time
from pathlib import Path

from vime_ext.arguments import TrainConfig
from vime_ext.driver.cluster import Cluster
from vime_ext.driver.handover import HandOver
from vime_ext.rollout.failures import last_line
from vime_ext.trainer.checkpoint import TRACKER_FILE, SaveError, has_checkpoint, partial_dir


class Recovery:
    def __init__(self, config: TrainConfig, cluster: Cluster, handover: HandOver, started: float):
        self.config = config
        self.cluster = cluster
        self.handover = handover
        self.started = started  # --exit-duration-in-mins counts the start-up too
        self.start_rollout = 0
        self.restarts = 0  # trainer-rank restarts so far (--max-restarts)
        self.initial_data: dict | None = None  # the data position the run started from, for a restart without save
        self.positions: dict[int, dict] = {}  # the data position before each rollout drew its prompts
        self.last_rollout: int | None = None  # --exit-duration-in-mins: the step the run stops after
        self.asked: int | None = None  # the last rollout whose time out_of_time has looked at
        # The rollouts whose optimizer steps the weights hold, in order; None after loading a checkpoint saved
        # before vime_ext recorded them (unknown).
        self.trained: list[int] | None = []

    def record_step(self, rollout_id: int) -> None:
        """Rollout ``rollout_id``'s optimizer step is now in the weights."""
        if self.trained is not None:
            self.trained.append(rollout_id)

    def out_of_time(self, rollout_id: int) -> bool:
        """Whether rollout ``rollout_id`` is the last one --exit-duration-in-mins allows. The clock is read at the
        first question about a rollout (the save's, after its training) and later questions get the same answer:
        the step's hand-over and logging may cross the limit, and a loop that then stopped would stop unsaved."""
        limit = self.config.checkpoint.exit_duration_in_mins
        if self.asked != rollout_id:
            self.asked = rollout_id
            if self.last_rollout is None and limit is not None and time.monotonic() - self.started >= 60 * limit:
                self.last_rollout = rollout_id
        return self.last_rollout == rollout_id

    def save_if_due(self, rollout_id: int, times: dict[str, float]) -> None:
        """Save after rollout ``rollout_id`` when --save-interval, the last rollout or the time limit asks."""
        c = self.config.checkpoint
        last = self.out_of_time(rollout_id) or rollout_id + 1 == self.config.data.num_rollout
        if c.save and (last or bool(c.save_interval and (rollout_id + 1) % c.save_interval == 0)):
            times["save"] = self.save(rollout_id)

    def save(self, rollout_id: int) -> float:
        start = time.perf_counter()
        # The position before rollout rollout_id + 1 drew its prompts: with --async-training it may have been
        # drawn (and be generating) already, and a resume must draw the same prompts again.
        data = self.positions.get(rollout_id + 1)
        if data is None and self.cluster.has_manager:
            with self.handover.lock:
                data = self.positions.get(rollout_id + 1) or self.cluster.manager.data_state()
        trained = None if self.trained is None else list(self.trained)  # a copy: the next step appends
        extra = {"next_rollout": rollout_id + 1, "data": data, "trained": trained}
        save = self.config.checkpoint.save
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            self.cluster.ranks.save(save, rollout_id + 1, extra)
        except (OSError, CheckpointException) as err:  # a full disk, a quota, a lost mount (Ray's errors subclass
            # their cause); megatron's writer wraps the OSError of its worker in a CheckpointException.
            # The partial iteration is useless, and in the way of the room a resume needs.
            shutil.rmtree(partial_dir(save, rollout_id + 1), ignore_errors=True)
            tracker = Path(save) / TRACKER_FILE
            last = f"iteration {tracker.read_text().strip()}" if tracker.is_file() else "none yet"
            free = shutil.disk_usage(save).free / 2**20
            raise SaveError(f"saving iteration {rollout_id + 1} to {save} failed ({_os_cause(err)}; {free:.0f} "
                            f"MiB free there). The last complete checkpoint ({last}) is untouched; make room and "
                            f"resume with --load {save}") from err
        return time.perf_counter() - start

    def resume(self) -> None:
        """``--load``'s checkpoint when it holds one; else the weights the ranks started from (``--ref-load``'s,
        which the engines, started from ``--hf-checkpoint``, then receive)."""
        path, ref_load = self.config.checkpoint.load, self.config.checkpoint.ref_load
        if self.cluster.has_actors:
            if path and has_checkpoint(path):
                self.start_rollout = self.load(path)
                print(f"resumed from {path} at rollout {self.start_rollout}")
            else:
                if path:
                    start = f"--ref-load {ref_load}" if ref_load else "--hf-checkpoint"
                    print(f"--load {path}: no checkpoint there yet; starting from {start}")
                if ref_load and self.cluster.has_engines:
                    self.handover.round_trip(0, {}, {})
        if self.cluster.has_manager:
            self.initial_data = self.cluster.manager.data_state()

    def load(self, path: str) -> int:
        """A checkpoint into the trainer ranks, its data position into the rollout manager, its weights to the
        engines; returns the rollout to go on from."""
        times, memory = {}, {}
        self.handover.to_trainer(times, memory)
        state = self.cluster.ranks.load(path)[0]
        self.trained = state.get("trained")
        if self.cluster.has_manager and state["data"] is not None:
            self.cluster.manager.load_data_state(state["data"])
        next_rollout = int(state["next_rollout"])
        self.handover.to_engines(next_rollout, times, memory)
        return next_rollout

    def can_restart(self) -> bool:
        return self.restarts < self.config.cluster.max_restarts

    def recover(self, err: Exception, rollout_id: int) -> int:
        """A trainer rank died or hung in rollout ``rollout_id``: a new group of ranks starts, loads the last
        complete checkpoint (``--save``'s, else the one the run started from, else the starting weights and data
        position), and the run goes on from there; the rollouts since are generated again, and their steps
        trained once, on the restored weights."""
        self.restarts += 1
        print(f"rollout {rollout_id}: {err}; restarting the trainer ranks ({self.restarts} of --max-restarts "
              f"{self.config.cluster.max_restarts})", flush=True)
        self.cluster.restart_actors()
        for path in (self.config.checkpoint.save, self.config.checkpoint.load):
            if path and has_checkpoint(path):
                rollout_id = self.load(path)
                print(f"the trainer ranks restarted from {path}; going on from rollout {rollout_id}", flush=True)
                return rollout_id
        if self.cluster.has_manager:
            self.cluster.manager.load_data_state(self.initial_data)
        self.trained = []  # the starting weights
        self.handover.round_trip(self.start_rollout, {}, {})
        print(f"no checkpoint yet: the trainer ranks restarted from their starting weights; going on from rollout "
              f"{self.start_rollout}", flush=True)
        return self.start_rollout


def lineage_metrics(trained: list[int] | None) -> dict[str, float]:
    """How many rollouts the weights hold a step of, and how many of them more than once (0 unless a resume or a
    restart went on from the wrong rollout); nothing when the lineage is unknown (an older checkpoint)."""
    if trained is None:
        return {}
    distinct = set(trained)
    return {"train/rollouts_in_weights": float(len(distinct)),
            "train/rollouts_trained_twice": float(len(trained) - len(distinct))}


def _os_cause(err: BaseException) -> str:
    """The operating system's words for a failed write, dug out of the wrappers around it (megatron's writer
    threads, torch's CheckpointException, Ray), else the error's own last line."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.strerror:
            return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        todo += [f for f in getattr(e, "failures", {}).values() if isinstance(f, BaseException)]
    return last_line(err)
