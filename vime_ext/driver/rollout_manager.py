"""The rollout side of training: engines, the router in front of them, the prompt data, rollouts, weight
updates, sleep/wake.

The driver owns one ``RolloutManager`` (a Ray actor, or a plain object with ``--no-ray``). Engines are
subprocesses of the manager's host; on GPUs each gets its own ``CUDA_VISIBLE_DEVICES`` slice. The manager owns
the training data source (its position goes into checkpoints through ``data_state``) and one per evaluation
set, and runs the rollout function with the plug-in ``args`` (tokenizer and router client attached). An SFT run
(``--loss-type sft_loss``) gets a manager without engines, router or weight sync: its rollout function reads chats.
"""

import os
import subprocess
import time

from vime_ext.arguments import TrainConfig
from vime_ext.engines.engine_watchdog import EngineWatchdog
from vime_ext.engines.generation_gate import GenerationGate
from vime_ext.engines.reward_engine import RewardModelEngine
from vime_ext.engines.servers import (EngineConfig, ServerProcess, in_memory_share, launch_engines,
                                      launch_router, start_together, stream_interval_args, wait_until_serving)
from vime_ext.engines.weight_sync import WeightSync, WeightTarget
from vime_ext.gpu_sharing import EnginePlacement, GpuSharing
from vime_ext.net import free_port
from vime_ext.rollout.data_source import DataSource
from vime_ext.rollout.rollout import RolloutOutput, run_rollout


def engine_args(config: TrainConfig, sharing: GpuSharing, on_gpu: bool) -> list[str]:
    """The policy engines' server flags: the run's --vllm-* flags, the GPU-sharing layout's, and vLLM's
    --stream-interval for --rollout-stream-interval (unless given as --vllm-stream-interval)."""
    return (sharing.engine_args(list(config.vllm_args), on_gpu)
            + stream_interval_args(config.rollout.rollout_stream_interval, config.cluster.engine_backend,
                                   config.vllm_args))


class RolloutManager:
    def __init__(self, config: TrainConfig, placement: EnginePlacement | None = None, log_dir: str | None = None,
                 hf_checkpoint: str | None = None):
        """``placement``: each engine's GPUs (and, colocated, the trainer ranks beside it); default: this
        process's GPUs split as ``--rollout-num-gpus-per-engine`` says, or processes on a CPU.
        ``hf_checkpoint``: the weights the engines start from (default ``--hf-checkpoint``)."""
        self.config = config
        d, e = config.data, config.eval
        model = hf_checkpoint or config.checkpoint.hf_checkpoint
        self.engines: list[ServerProcess] = []
        self.router: ServerProcess | None = None
        self.reward_model: RewardModelEngine | None = None
        self.watchdog: EngineWatchdog | None = None
        self.restarts = 0
        self.router_restarts = 0
        self.fresh: set[str] = set()  # engines restarted since the last sleep: awake, and not to be woken again
        self.weight_version = 0
        self.generation = 0  # engine restarts so far that the sender must know of (a new NCCL group)
        self.sync: WeightSync | None = None
        # --partial-rollout: a push may land mid-rollout; the training rollouts' client waits at this gate
        self.gate = GenerationGate() if config.rollout.partial_rollout else None
        try:
            if not config.sft:  # SFT reads its chats; nothing is generated
                sharing = GpuSharing.from_config(config)
                self.placement = placement or sharing.place_separate(gpu_ids_from_env())
                self._launch_engines(model, sharing, log_dir)
            # The engines load their weights while this process reads the tokenizer and the data (the driver
            # has checked the data already, before anything started).
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.args = config.plugin_args()
            self.args.tokenizer = self.tokenizer
            self.data_source = DataSource(config.read_data(d.prompt_data), config.rollout.n_samples_per_prompt,
                                          shuffle=d.rollout_shuffle, seed=d.seed)
            self.eval_sources = {name: DataSource(config.read_data(path), e.n_samples_per_eval_prompt)
                                 for name, path in e.datasets().items()}
            if not config.sft:
                self._await_engines()
        except BaseException:
            self.shutdown()
            raise
        if not config.sft:
            self.sync = WeightSync(self.engine_urls(), transport=self.transport)
            self.sync.init()
            if config.cluster.engine_hang_timeout > 0:
                self.watchdog = EngineWatchdog(lambda: self.engines, config.cluster.engine_hang_timeout)

    def _launch_engines(self, model: str, sharing: GpuSharing, log_dir: str | None) -> None:
        """Start the engines' processes (and the reward model's beside them where it need not wait for their
        GPU start lock: on CPUs, or with fixed KV caches); ``_await_engines`` waits until they serve."""
        config, cl = self.config, self.config.cluster
        self.log_dir = log_dir
        on_gpu = any(self.placement.gpus)
        self.transport = sharing.transport(on_gpu)
        extra = engine_args(config, sharing, on_gpu)
        # Fixed ports: a crashed engine is restarted at the same address, which the router already knows.
        self.engine_configs: list[EngineConfig] = []
        for gpus in self.placement.gpus:
            env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))} if gpus else {}
            self.engine_configs.append(EngineConfig(
                model, backend=cl.engine_backend, host=cl.engine_host, port=free_port(), dtype=cl.engine_dtype,
                max_model_len=cl.engine_max_model_len, extra_args=extra, env=env, log_dir=log_dir,
                weight_transport=self.transport))
        self.rm_config = self._reward_model_config(self.placement.gpus[0]) if config.rollout.rm_hf_checkpoint \
            else None
        # Engines sharing a GPU (--rollout-engines-per-gpu) start one after another on it; a failed launch leaves
        # those launched before it in self.engines, for shutdown(). Then in placement order (the push's routes).
        self.engines = launch_engines(self.engine_configs, self.engines)
        print(f"starting {len(self.engines)} {cl.engine_backend} engine(s); logs: "
              f"{', '.join(str(e.log_path) for e in self.engines)}", flush=True)
        if self.rm_config is not None and all(start_together(self.rm_config, c) for c in self.engine_configs):
            self.reward_model = RewardModelEngine(self.rm_config, wait=False)

    def _await_engines(self) -> None:
        """Until the engines serve, then the router over them, then the reward model's engine (on a GPU it
        starts only now, unless both have fixed KV caches: it shares the first engine's GPU, whose start lock
        that engine held until it served)."""
        wait_until_serving(self.engines, timeout_s=900)
        self._launch_router()
        if self.rm_config is not None:
            if self.reward_model is None:
                self.reward_model = RewardModelEngine(self.rm_config)
            else:
                self.reward_model.wait_until_serving()
            self.args.rm_url = self.reward_model.url

    def _reward_model_config(self, gpu_ids: tuple[int, ...]) -> EngineConfig:
        """--rm-hf-checkpoint's engine: the policy engines' --vllm-* flags, on the first engine GPU in a share of
        its memory of its own, without the weight-update routes or sleep mode, at a fixed port (a restart keeps
        args.rm_url)."""
        config, cl = self.config, self.config.cluster
        env = {"CUDA_VISIBLE_DEVICES": str(gpu_ids[0])} if gpu_ids else {}
        extra = in_memory_share(config.vllm_args, config.rollout.rm_gpu_memory_utilization
                                if gpu_ids and cl.engine_backend == "vllm" else None)
        return EngineConfig(config.rollout.rm_hf_checkpoint, backend=cl.engine_backend, host=cl.engine_host,
                            port=free_port(), dtype=cl.engine_dtype, max_model_len=cl.engine_max_model_len,
                            extra_args=extra, env=env, log_dir=self.log_dir, rl_routes=False)

    def _launch_router(self) -> None:
        """A router over the engines; a new one after an engine restart, since the old one's circuit breaker
        keeps a restarted engine out for a while after its failures, and after the router itself died."""
        if self.router is not None:
            self.router.stop()
        self.router = launch_router(self.engine_urls(), policy=self.config.cluster.router_policy,
                                    log_dir=self.log_dir)
        wait_until_serving([self.router], timeout_s=120)

    def engine_urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def weight_target(self) -> WeightTarget:
        """Where the trainer sends weights, and over which transport."""
        return WeightTarget(tuple(self.engine_urls()), self.transport,
                            self.config.cluster.rollout_num_gpus_per_engine, self.generation, self.placement.ranks)

    def rollout(self, rollout_id: int) -> RolloutOutput:
        """One training rollout: ``--rollout-batch-size`` checked groups from the training data."""
        return self._run(rollout_id, self.data_source, evaluation=False)

    def evaluate(self, rollout_id: int) -> dict[str, RolloutOutput]:
        """Every evaluation set, whole, with the ``--eval-*`` sampling settings."""
        return {name: self._run(rollout_id, source, evaluation=True) for name, source in self.eval_sources.items()}

    def _run(self, rollout_id: int, source: DataSource, evaluation: bool) -> RolloutOutput:
        self._check_engines()
        if self.router is not None and not self.router.alive():
            print(f"the router exited (code {self.router.process.returncode}); restarting it. Its log: "
                  f"{self.router.log_path}", flush=True)
            self._launch_router()
            self.router_restarts += 1
        self.args.weight_version = self.weight_version
        gate = None if evaluation else self.gate  # an evaluation runs between pushes, on the driver's thread
        before = gate.interruptions if gate else 0
        output = run_rollout(self.args, self.router.url if self.router else None, rollout_id, source,
                             evaluation=evaluation, gate=gate)
        if gate:
            output.metrics["interrupted_requests"] = gate.interruptions - before
        return output

    def data_state(self) -> dict:
        return self.data_source.state()

    def load_data_state(self, state: dict) -> None:
        self.data_source.load_state(state)

    def dead_engines(self, wait_s: float = 0.0) -> list[str]:
        """Engines whose process has exited. After an error a dying engine may have caused, ``wait_s`` waits up to
        that long for one to be seen dead: a SIGKILL resets its connections before its process can be reaped."""
        deadline = time.monotonic() + wait_s
        while True:
            dead = [e.url for e in self.engines if not e.alive()]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.1)

    def dead_servers(self) -> list[str]:
        """Dead engines' URLs, and "router" if the router is dead (restarted at the next rollout)."""
        return self.dead_engines() + (["router"] if self.router is not None and not self.router.alive() else [])

    def _check_engines(self) -> None:
        dead = [e for e in self.engines if not e.alive()]
        if dead and len(dead) == len(self.engines):
            raise RuntimeError(f"every engine has exited; the first: log {dead[0].log_path}, "
                               f"{dead[0].failure_report()}")

    # ---- weights and memory, around a training step -----------------------------------------------------

    def restart_dead_engines(self) -> int:
        """Relaunch engines whose process has exited (same address, so the router and the weight sync find
        them again) and wait until they serve. They start from the HF weights: call this before a weight push,
        which brings them to the trainer's. Returns how many were restarted."""
        dead = [i for i, e in enumerate(self.engines) if not e.alive()]
        for i in dead:
            print(f"engine {self.engines[i].url} exited (code {self.engines[i].process.returncode}); restarting. "
                  f"Its log: {self.engines[i].log_path}")
            self.engines[i].stop()  # the processes it left (vLLM's engine core keeps the GPU's memory)
        if dead:
            # through launch_engines: two dead engines sharing a GPU start one after another
            started: list[ServerProcess] = []
            try:
                for i, server in zip(dead, launch_engines([self.engine_configs[i] for i in dead], started)):
                    self.engines[i] = server
            except BaseException:
                for server in started:
                    server.stop()
                raise
            wait_until_serving([self.engines[i] for i in dead], timeout_s=900)
            self.sync.init([self.engines[i].url for i in dead])
            self.generation += 1
            self.restarts += len(dead)
            self.fresh.update(self.engines[i].url for i in dead)
            self._launch_router()
        return len(dead)

    def begin_weight_update(self) -> None:
        """Pause the engines for a push; requests in flight are aborted (with --partial-rollout, held at the gate
        first, and continued after ``finish_weight_update``)."""
        if self.gate:
            self.gate.close()
        self.restart_dead_engines()
        # An engine can die between that check and these calls (the watchdog kills a hung one while /pause waits
        # on it): _post_all restarts it and opens the update on the new one.
        self._post_all("/pause", mode="abort")
        self._post_all("/start_weight_update")

    def finish_weight_update(self, version: int) -> None:
        self.sync.finish(version)
        self.weight_version = version
        if self.gate:
            self.gate.open(version)

    def restart_count(self) -> dict[str, int]:
        counts = {"engine_restarts": self.restarts, "router_restarts": self.router_restarts}
        if self.watchdog is not None:
            counts["engine_hangs"] = self.watchdog.hangs
        if self.reward_model is not None:
            counts["rm_engine_restarts"] = self.reward_model.restarts
        return counts

    def _post_all(self, route: str, skip: set[str] = frozenset(), **params) -> None:
        """``route`` to every engine but ``skip``. One that fails because its engine just died (it may die at any
        moment, not only when it is checked) is restarted; the new engine gets the route too, unless it is a
        wake-up (a new engine is awake already)."""
        for i, url in enumerate(self.engine_urls()):
            if url in skip:
                continue
            try:
                self.sync.post(url, route, params=params)
            except Exception:  # noqa: BLE001 (re-raised unless the engine's process is gone)
                if not self._exited(i):
                    raise
                self.restart_dead_engines()
                if route != "/wake_up":
                    self.sync.post(url, route, params=params)

    def _exited(self, i: int, grace_s: float = 10.0) -> bool:
        """Whether engine ``i``'s process has exited, or does within ``grace_s`` (a kill is not instant)."""
        try:
            self.engines[i].process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def sleep(self) -> None:
        """Colocated mode: engines give their accelerator memory back while the actors train. One that died
        during the rollout is restarted first, while the memory is still the engines' (it serves the starting
        weights until the next push, and nothing is generated before then), and sleeps with the others."""
        self.restart_dead_engines()
        self._post_all("/pause", mode="abort")
        # Level 2 drops the weights instead of copying them out and back: every wake is followed by a full push.
        self._post_all("/sleep", level=self.config.cluster.engine_sleep_level)
        self.fresh.clear()  # every engine sleeps now, one restarted during these calls too: all are to be woken

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Give the engines their memory back: all of it, or only ``tags`` (vLLM's ``weights``, ``kv_cache``),
        so that a colocated trainer can push its weights before the KV cache returns. One that died while
        asleep is restarted (awake) instead, and not woken again."""
        self.restart_dead_engines()
        self._post_all("/wake_up", skip=self.fresh, **({"tags": tags} if tags else {}))

    def shutdown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.reward_model is not None:
            self.reward_model.stop()
        for server in [self.router, *self.engines]:
            if server is not None:
                server.stop()
        if getattr(self, "sync", None) is not None:
            self.sync.close()


def gpu_ids_from_env() -> list[int] | None:
    """The GPUs this process may use (Ray sets CUDA_VISIBLE_DEVICES for GPU actors); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return [int(g) for g in visible.split(",")] if visible else list(range(torch.cuda.device_count()))
