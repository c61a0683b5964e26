"""Where the trainer ranks and the rollout manager run: Ray actors in a placement group, or (``--no-ray``)
this process.

Placement: one bundle per trainer rank (1 GPU each, packed onto as few nodes as possible) and one for the
rollout manager, with the engines' GPUs when they have their own; ``gpu_sharing.py`` decides which, where the
engines go, and the memory hand-overs. Without GPUs the bundles hold CPUs only and the counts mean processes.
``--debug-train-only`` starts no rollout manager (no engines), ``--debug-rollout-only`` no trainer ranks; an SFT
run (``--loss-type sft_loss``) a rollout manager without engines (it reads the chats), on a CPU.

Every Ray worker gets the launch directory (the driver's working directory) on its module path, through Ray's
runtime environment, so plug-ins named by dotted path import there as they do in the driver.
"""

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from vime_ext.arguments import TrainConfig
from vime_ext.gpu_sharing import EnginePlacement, GpuSharing, RankDevice
from vime_ext.net import free_port
from vime_ext.trainer.results import LossSum, RankLayout, StepResult

if TYPE_CHECKING:
    from vime_ext.algorithms.train_data import TrainSequence
    from vime_ext.engines.weight_sync import WeightTarget
    from vime_ext.rollout.rollout import RolloutOutput

# Passed to every Ray worker: nothing is fetched from a hub at run time, caches stay where the driver's are, and
# OpenMP threads wait as the driver's do (vime_ext/__init__.py).
_WORKER_ENV = ("HF_HUB_OFFLINE", "OMP_WAIT_POLICY", "TOKENIZERS_PARALLELISM", "VIME_EXT_CACHE", "VIME_EXT_LOG_DIR",
               "VLLM_CPU_KVCACHE_SPACE", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
               "VLLM_FLASHINFER_ALLREDUCE_BACKEND", "PYTHONPATH")


def connect_ray(world: int) -> None:
    """Join the Ray cluster ``RAY_ADDRESS`` names (the launch scripts' ``start_ray`` sets it; several nodes: the
    head's), or start a private one for this run, never joining another Ray that happens to run on the machine
    (``address="local"``). A running cluster's resources are its own (Ray refuses ``num_cpus`` when joining); a
    private one gets a logical CPU per process whatever the core count, since without GPUs every trainer rank and
    the rollout manager take one."""
    import ray

    env = {k: os.environ[k] for k in _WORKER_ENV if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), *filter(None, [env.get("PYTHONPATH")])])
    common = dict(include_dashboard=False, runtime_env={"env_vars": env}, log_to_driver=True)
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **common)
    else:
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, world + 2), **common)


def _ray_node_address() -> str:
    """The address of the Ray node this worker runs on, as the node was started with (``ray start
    --node-ip-address``): the one its peers reach it at. ``ray.util.get_node_ip_address`` answers with the
    machine's outward interface instead, which on a node started on another address (a second loopback node, a
    machine with several networks) is not the node's."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)


class _TrainWorker:
    """The Ray-side holder of one TrainActor (created after the rank-0 address is known)."""

    def node_ip(self) -> str:
        return _ray_node_address()

    def address(self, one_node: bool) -> tuple[str, int]:
        """Where rank 0's store listens: the loopback when every rank is on its node, else the node's address."""
        return ("127.0.0.1" if one_node else self.node_ip()), free_port()

    def device(self) -> RankDevice:
        """This rank's node and GPU (Ray's index on the node; -1 without one)."""
        import ray

        gpus = ray.get_gpu_ids()
        return RankDevice(self.node_ip(), int(gpus[0]) if gpus else -1)

    def setup(self, config: TrainConfig, rank: int, world: int, addr: str, port: int) -> RankLayout:
        from vime_ext.trainer.actor import TrainActor

        self.actor = TrainActor(config, rank, world, addr, port, local_rank=0)
        return self.actor.layout()

    def call(self, method: str, *args):
        self.actor.progress.tick(method)
        try:
            return getattr(self.actor, method)(*args)
        finally:
            self.actor.progress.tick(f"after {method}")

    def heartbeat(self) -> tuple[int, str]:
        """The rank's progress count and phase. Runs in a concurrency group of its own (``_train_worker``), so it
        answers while ``call`` works, unless the whole process is stopped."""
        actor = getattr(self, "actor", None)
        return actor.progress.read() if actor is not None else (0, "starting")


def _train_worker():
    """``_TrainWorker`` as a Ray actor class whose heartbeat has a thread of its own."""
    import ray

    cls = type("_TrainWorker", (_TrainWorker,), {  # the name process titles show
        "heartbeat": ray.method(concurrency_group="watch")(_TrainWorker.heartbeat)})
    return ray.remote(concurrency_groups={"watch": 1})(cls)


def _by_node(nodes: list[str]) -> str:
    """``["a", "b", "a"]`` -> ``"a (ranks 0, 2), b (rank 1)"``."""
    parts = []
    for node in dict.fromkeys(nodes):
        ranks = [str(r) for r, n in enumerate(nodes) if n == node]
        parts.append(f"{node} (rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)})")
    return ", ".join(parts)


class _ManagerWorker:
    def node_ip(self) -> str:
        return _ray_node_address()

    def setup(self, config: TrainConfig, placement: EnginePlacement | None, log_dir: str | None) -> list[str]:
        from vime_ext.driver.rollout_manager import RolloutManager

        self.manager = RolloutManager(config, placement, log_dir)
        return self.manager.engine_urls()

    def call(self, method: str, *args):
        return getattr(self.manager, method)(*args)


class TrainerDied(RuntimeError):
    """A trainer rank's process is gone (OOM-killed, node lost), or hung; the driver may restart the group."""


class TrainerHung(TrainerDied):
    """A trainer rank made no progress for --trainer-hang-timeout seconds (stopped, or stuck in a collective)."""


class TrainerRanks:
    """Every trainer rank, called with ``TrainActor``'s methods and signatures: each call runs on all ranks at
    once and returns their results in rank order. Methods whose argument is a rank's data-parallel share take one
    per rank. The ranks are ``TrainActor`` objects in this process (``--no-ray``) or Ray actors
    (``_TrainWorker``), so the driver's code is the same either way; tests/test_cluster_proxies.py checks that
    every method here exists on ``TrainActor`` with the same parameters."""

    def __init__(self, handles: list, use_ray: bool, hang_timeout: float = 0.0):
        self.handles, self._use_ray, self.hang_timeout = handles, use_ray, hang_timeout

    def __len__(self) -> int:
        return len(self.handles)

    def _each(self, method: str, per_rank: list[tuple]) -> list:
        if not self._use_ray:
            return [getattr(h, method)(*args) for h, args in zip(self.handles, per_rank)]
        import ray

        refs = [h.call.remote(method, *args) for h, args in zip(self.handles, per_rank)]
        try:
            if self.hang_timeout:
                self._watch(refs, method)
            return ray.get(refs)
        except ray.exceptions.RayActorError as err:
            raise TrainerDied(f"a trainer rank died during {method}: {str(err).strip().splitlines()[0]}") from err

    def _watch(self, refs: list, method: str) -> None:
        """Wait for every rank's call, reading each working rank's progress meanwhile; a rank whose count has not
        moved, or that has not answered, for ``hang_timeout`` seconds is named and the group given up as hung
        (the driver then restarts it as after a dead rank). A rank that fails returns at once."""
        import ray

        poll = min(10.0, self.hang_timeout / 4)
        seen = [None] * len(refs)
        moved = [time.monotonic()] * len(refs)
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=poll)
            ray.get(done)  # a rank that failed (or died) raises here, without waiting for the others
            working = [i for i, ref in enumerate(refs) if ref in pending]
            beats = {i: self.handles[i].heartbeat.remote() for i in working}
            answered, _ = ray.wait(list(beats.values()), num_returns=len(beats), timeout=poll)
            now = time.monotonic()
            for i, beat in beats.items():
                # no answer: the process answers nothing (stopped, or wedged)
                progress = ray.get(beat) if beat in answered else None
                if progress is not None and progress != seen[i]:
                    seen[i], moved[i] = progress, now
                elif now - moved[i] > self.hang_timeout:
                    phase = seen[i][1] if seen[i] else method
                    state = "did not answer" if progress is None else "made no progress"
                    raise TrainerHung(f"trainer rank {i} {state} for {now - moved[i]:.0f} s during {method} "
                                      f"(last phase: {phase}; --trainer-hang-timeout {self.hang_timeout:g})")

    def _all(self, method: str, *args) -> list:
        return self._each(method, [args] * len(self.handles))

    def layout(self) -> list[RankLayout]:
        return self._all("layout")

    def release_memory(self, keep_weights: bool = False) -> list[dict[str, float]]:
        return self._all("release_memory", keep_weights)

    def restore_memory(self) -> list[dict[str, float]]:
        return self._all("restore_memory")

    def memory(self) -> list[dict[str, float]]:
        return self._all("memory")

    def train_rollout(self, steps: list[list[list["TrainSequence"]]], totals: list[tuple[float, float]],
                      update_policy: bool = True) -> list[StepResult]:
        """``steps[i]``: rank i's shares of the rollout's optimizer steps."""
        return self._each("train_rollout", [(share, totals, update_policy) for share in steps])

    def eval_loss(self, sequences: list[list["TrainSequence"]]) -> list[LossSum]:
        """``sequences[i]``: rank i's share."""
        return self._each("eval_loss", [(share,) for share in sequences])

    def push_weights(self, target: "WeightTarget", bucket_bytes: int) -> list[int]:
        return self._all("push_weights", target, bucket_bytes)

    def save(self, save_dir: str, iteration: int, extra_state: dict) -> list[str]:
        return self._all("save", save_dir, iteration, extra_state)

    def load(self, path: str) -> list[dict]:
        return self._all("load", path)

    def shutdown(self) -> None:
        self._all("shutdown")


class RolloutManagerHandle:
    """The rollout manager, called with ``RolloutManager``'s methods and signatures, in this process or as a Ray
    actor (``_ManagerWorker``); tests/test_cluster_proxies.py checks the two agree."""

    def __init__(self, handle, use_ray: bool):
        self.handle, self._use_ray = handle, use_ray

    def _call(self, method: str, *args):
        if not self._use_ray:
            return getattr(self.handle, method)(*args)
        import ray

        return ray.get(self.handle.call.remote(method, *args))

    def engine_urls(self) -> list[str]:
        return self._call("engine_urls")

    def weight_target(self) -> "WeightTarget":
        return self._call("weight_target")

    def rollout(self, rollout_id: int) -> "RolloutOutput":
        return self._call("rollout", rollout_id)

    def evaluate(self, rollout_id: int) -> dict[str, "RolloutOutput"]:
        return self._call("evaluate", rollout_id)

    def data_state(self) -> dict:
        return self._call("data_state")

    def load_data_state(self, state: dict) -> None:
        self._call("load_data_state", state)

    def dead_engines(self, wait_s: float = 0.0) -> list[str]:
        return self._call("dead_engines", wait_s)

    def dead_servers(self) -> list[str]:
        return self._call("dead_servers")

    def begin_weight_update(self) -> None:
        self._call("begin_weight_update")

    def finish_weight_update(self, version: int) -> None:
        self._call("finish_weight_update", version)

    def restart_count(self) -> dict[str, int]:
        return self._call("restart_count")

    def sleep(self) -> None:
        self._call("sleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._call("wake_up", tags)

    def shutdown(self) -> None:
        self._call("shutdown")


class Cluster:
    """The trainer ranks (``ranks``) and the rollout manager (``manager``), started as Ray actors or in this
    process; their proxies hide which."""

    def __init__(self, config: TrainConfig, log_dir: str | None = None):
        self.config = config
        self.sharing = GpuSharing.from_config(config)
        self.use_ray = not config.cluster.no_ray
        self.has_manager = not config.debug.debug_train_only
        self.has_actors = not config.debug.debug_rollout_only
        self.has_engines = self.has_manager and not config.sft
        self.ranks = TrainerRanks([], self.use_ray)
        self.manager: RolloutManagerHandle | None = None
        self.layouts: list[RankLayout] = []
        if self.use_ray:
            self._start_ray(log_dir)
        else:
            self._start_local(log_dir)

    def _start_local(self, log_dir):
        from vime_ext.driver.rollout_manager import RolloutManager, gpu_ids_from_env

        if self.has_manager and not self.sharing.shares_gpus:
            # Engines on devices of their own start (the manager's thread waits on their processes) while the rank
            # loads its weights here.
            with ThreadPoolExecutor(1, thread_name_prefix="rollout-manager-start") as pool:
                started = pool.submit(RolloutManager, self.config, None, log_dir)
                try:
                    self._start_local_rank()
                except BaseException:
                    with contextlib.suppress(Exception):
                        started.result().shutdown()
                    raise
                self.manager = RolloutManagerHandle(started.result(), False)
            return
        self._start_local_rank()
        if self.has_manager:
            placement = None
            gpus = gpu_ids_from_env()
            if self.sharing.shares_gpus and gpus and self.has_actors:  # the one rank runs on the first visible GPU
                placement = self.sharing.place_colocated([RankDevice("local", gpus[0])])
            self.sharing.before_engines_start(self.ranks)
            self.manager = RolloutManagerHandle(RolloutManager(self.config, placement, log_dir), False)
            self.sharing.after_engines_start(self.ranks)

    def _start_local_rank(self) -> None:
        from vime_ext.trainer.actor import TrainActor

        if self.has_actors:
            self.ranks = TrainerRanks([TrainActor(self.config, 0, 1, "127.0.0.1", free_port())], use_ray=False)
            self.layouts = self.ranks.layout()

    def _start_ray(self, log_dir):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cl = self.config.cluster
        world = cl.actor_world_size if self.has_actors else 0
        gpus = torch.cuda.is_available()
        if not ray.is_initialized():
            connect_ray(world)
        actor_bundle = {"CPU": 1, **({"GPU": 1} if gpus else {})}
        bundles = [dict(actor_bundle) for _ in range(world)]
        rollout_gpus = self.sharing.rollout_bundle_gpus(self.has_engines)
        if self.has_manager:
            bundles.append({"CPU": 1, **({"GPU": rollout_gpus} if rollout_gpus else {})})
        self.placement_group = placement_group(bundles, strategy="PACK")
        ray.get(self.placement_group.ready(), timeout=600)

        def in_bundle(i):
            return PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=i)

        self._in_bundle = in_bundle
        setups = self._start_actors(world)
        if not self.has_manager:
            self.layouts = ray.get(setups)
            return
        placement = None
        if self.sharing.shares_gpus:  # engines size their memory after the ranks loaded (and released) theirs
            self.layouts, setups = ray.get(setups), []
            if gpus and world:
                placement = self.sharing.place_colocated(ray.get([a.device.remote() for a in self.ranks.handles]))
        self.sharing.before_engines_start(self.ranks)
        # Threaded: with --async-training the driver calls it (pushes, metrics) while the producer's rollout runs.
        worker = ray.remote(_ManagerWorker).options(
            num_cpus=1, num_gpus=rollout_gpus, scheduling_strategy=in_bundle(world), max_concurrency=4).remote()
        print(f"rollout manager (and its engines) on {ray.get(worker.node_ip.remote())}", flush=True)
        started = worker.setup.remote(self.config, placement, log_dir)
        self.manager = RolloutManagerHandle(worker, use_ray=True)
        if setups:  # engines on GPUs of their own start while the ranks load their weights
            try:
                self.layouts = ray.get(setups)
            except BaseException:
                with contextlib.suppress(Exception):  # the engines, once up, are stopped; the ranks' error is raised
                    ray.get(started)
                    self.manager.shutdown()
                raise
        ray.get(started)
        self.sharing.after_engines_start(self.ranks)

    def _start_actors(self, world: int) -> list:
        """One trainer rank per bundle of the placement group, each building its model (from --hf-checkpoint,
        or --ref-load); returns the ranks' setup calls, in flight (each gives its ``RankLayout``)."""
        import ray

        gpus = torch.cuda.is_available()
        worker_cls = _train_worker()
        workers = [worker_cls.options(num_cpus=1, num_gpus=1 if gpus else 0,
                                      scheduling_strategy=self._in_bundle(i)).remote() for i in range(world)]
        self.ranks = TrainerRanks(workers, use_ray=True, hang_timeout=self.config.cluster.trainer_hang_timeout)
        if not world:
            return []
        nodes = ray.get([a.node_ip.remote() for a in workers])
        print(f"trainer ranks on {_by_node(nodes)}", flush=True)
        one_node = len(set(nodes)) == 1
        addr, port = ray.get(workers[0].address.remote(one_node))
        return [a.setup.remote(self.config, r, world, addr, port) for r, a in enumerate(workers)]

    def restart_actors(self) -> None:
        """After a rank died: the survivors are killed too (their process group is broken) and a new group
        starts in the same bundles, with its starting weights; the driver then loads a checkpoint into it.
        Ray only: without Ray the trainer rank is the driver's own process."""
        import ray

        for worker in self.ranks.handles:
            ray.kill(worker, no_restart=True)
        self.layouts = ray.get(self._start_actors(len(self.ranks)))
        self.sharing.after_rank_restart(self.ranks)

    def shutdown(self) -> None:
        try:
            if self.manager is not None:
                self.manager.shutdown()
        finally:
            if self.use_ray:
                import ray

                ray.util.remove_placement_group(self.placement_group)
                ray.shutdown()
            elif len(self.ranks):
                self.ranks.shutdown()
