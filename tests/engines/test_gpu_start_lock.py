"""The per-GPU engine start lock (vime_ext/engines/gpu_start_lock.py) between real processes, and the server
helpers that take and release it. The GPU engines themselves cannot start here; stand-in servers do (Python's
http.server, which answers /health from a file of that name)."""

import subprocess
import sys
import textwrap
import time

import pytest

from vime_ext.engines import servers
from vime_ext.engines.gpu_start_lock import GpuStartLock
from vime_ext.engines.servers import (EngineConfig, ServerProcess, data_parallel_configs, engine_gpus,
                                     tensor_parallel_size, visible_gpus, wait_until_serving)
from vime_ext.net import free_port


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VIME_EXT_LOCK_DIR", str(tmp_path / "locks"))


def holder(gpu: str, hold_s: float, shared: bool = False) -> subprocess.Popen:
    """Another process that takes GPU ``gpu``'s lock (``shared``: as an engine with a fixed KV cache), says so,
    holds it ``hold_s`` and says when it lets go."""
    code = textwrap.dedent(f"""
        import time
        from vime_ext.engines.gpu_start_lock import GpuStartLock
        lock = GpuStartLock([{gpu!r}], what="holder", shared={shared})
        lock.acquire()
        print("held", time.time(), flush=True)
        time.sleep({hold_s})
        print("released", time.time(), flush=True)
        lock.release()
    """)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("held")
    return process


def free_elsewhere(gpu: str) -> bool:
    """Whether another process could take GPU ``gpu``'s lock within half a second."""
    code = (f"from vime_ext.engines.gpu_start_lock import GpuStartLock; "
            f"print(GpuStartLock([{gpu!r}]).acquire(timeout_s=0.5))")
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return answer.strip() == "True"


def released_at(process: subprocess.Popen) -> float:
    out, _ = process.communicate(timeout=60)
    return float(out.split()[-1])


def test_a_second_process_waits_until_the_first_lets_go(capsys):
    first = holder("0", 1.5)
    lock = GpuStartLock(["0"], what="second", report_every_s=0.5)
    assert lock.acquire()
    got = time.time()
    assert got >= released_at(first)
    out = capsys.readouterr().out
    assert "second on GPU 0 waits" in out and f"pid {first.pid} (holder)" in out
    lock.release()


def test_other_gpus_do_not_wait():
    first = holder("0", 3.0)
    lock = GpuStartLock(["1"])
    start = time.time()
    assert lock.acquire()
    assert time.time() - start < 1.0
    lock.release()
    first.wait(timeout=30)


def test_a_timeout_gives_up_holding_nothing():
    first = holder("1", 3.0)
    lock = GpuStartLock(["0", "1"])  # 0 is free and taken first, 1 is not: 0 must be given back
    assert not lock.acquire(timeout_s=0.5)
    assert not lock.held
    other = GpuStartLock(["0"])
    assert other.acquire(timeout_s=0.5)
    other.release()
    first.wait(timeout=30)


def test_two_engines_on_one_gpu_from_one_process_are_refused():
    lock = GpuStartLock(["0"])
    lock.acquire()
    with pytest.raises(RuntimeError, match="one after another"):
        GpuStartLock(["0"]).acquire()
    lock.release()
    again = GpuStartLock(["0"])
    assert again.acquire()
    again.release()


def test_engines_with_fixed_caches_start_side_by_side_and_a_sizing_start_waits_for_them():
    """Shared holds (engines given --kv-cache-memory-bytes) do not wait for one another, from other processes or
    this one; an exclusive hold (an engine that sizes its cache from free memory) waits for them, and they for it."""
    other = holder("0", 1.5, shared=True)
    mine = GpuStartLock(["0"], shared=True)
    start = time.time()
    assert mine.acquire() and time.time() - start < 1.0
    second = GpuStartLock(["0"], shared=True)  # this process again: shared beside shared is allowed
    assert second.acquire(timeout_s=0.5)
    assert not free_elsewhere("0")  # an exclusive start elsewhere waits
    with pytest.raises(RuntimeError, match="one after another"):
        GpuStartLock(["0"]).acquire()  # exclusive beside this process's shared holds would wait for itself
    second.release()
    mine.release()
    released_at(other)
    assert free_elsewhere("0")
    sizing = holder("1", 1.5)
    waiting = GpuStartLock(["1"], shared=True)
    assert waiting.acquire()
    assert time.time() >= released_at(sizing)
    with pytest.raises(RuntimeError, match="one after another"):
        GpuStartLock(["1"]).acquire()
    waiting.release()


def test_an_engine_with_a_fixed_cache_takes_the_lock_shared_and_starts_beside_another(monkeypatch):
    """fixed_kv_cache picks the lock's mode; start_together says whether one process may launch two engines
    before either serves (the evaluation's model and reader, train.py's policy and reward model): on other GPUs,
    or both with fixed caches."""
    fixed = ["--kv-cache-memory-bytes", "8589934592"]
    assert servers.fixed_kv_cache(EngineConfig("m", extra_args=fixed))
    assert servers.fixed_kv_cache(EngineConfig("m", extra_args=["--kv-cache-memory-bytes=1024"]))
    assert not servers.fixed_kv_cache(EngineConfig("m", extra_args=["--gpu-memory-utilization", "0.3"]))
    assert not servers.fixed_kv_cache(EngineConfig("m", backend="hf", extra_args=fixed))
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 2)

    def on(gpu: str, extra: list[str]) -> EngineConfig:
        return EngineConfig("m", extra_args=extra, env={"CUDA_VISIBLE_DEVICES": gpu})

    assert servers.start_together(on("0", fixed), on("0", fixed))
    assert not servers.start_together(on("0", fixed), on("0", []))
    assert servers.start_together(on("0", []), on("1", []))
    assert servers.start_together(EngineConfig("m", backend="hf"), EngineConfig("m", backend="hf"))


def stand_in(tmp_path, gpus: list[str], command) -> ServerProcess:
    """``command(port)`` started as launch_engine leaves a GPU engine: the start lock of ``gpus`` held."""
    lock = GpuStartLock(gpus)
    lock.acquire()
    port = free_port()
    server = servers.start_server("stand_in", command(port), "127.0.0.1", port, {}, str(tmp_path / "logs"))
    server.gpus, server.start_lock = gpus, lock
    return server


def www(tmp_path) -> str:
    """A folder with a file named health: http.server answers GET /health with 200 from it."""
    (tmp_path / "www").mkdir(exist_ok=True)
    (tmp_path / "www" / "health").write_text("ok")
    return str(tmp_path / "www")


def health_server(tmp_path, gpus: list[str]) -> ServerProcess:
    """A server that answers GET /health with 200 once it listens."""
    folder = www(tmp_path)
    return stand_in(tmp_path, gpus, lambda port: [sys.executable, "-m", "http.server", str(port), "--bind",
                                                  "127.0.0.1", "--directory", folder])


def test_serving_releases_the_lock_and_stopping_waits_for_another_start(tmp_path):
    server = health_server(tmp_path, ["2"])
    try:
        assert not free_elsewhere("2")  # held while it starts
        wait_until_serving([server], timeout_s=60)
        assert server.start_lock is None
        starting = holder("2", 1.5)  # another engine starts on the GPU: this one's exit must wait for it
        server.stop()
        stopped = time.time()
        assert stopped >= released_at(starting)
        assert not server.alive()
    finally:
        server.stop()


def test_stopping_does_not_wait_for_engines_with_fixed_caches_starting(tmp_path):
    """A stop frees memory, which spoils only a start that sizes its cache: it waits for those, not for engines
    with fixed caches starting on the GPU."""
    server = health_server(tmp_path, ["2"])
    try:
        wait_until_serving([server], timeout_s=60)
        starting = holder("2", 3.0, shared=True)
        server.stop()
        stopped = time.time()
        assert not server.alive() and stopped < released_at(starting)
    finally:
        server.stop()


def recorded_launches(tmp_path, monkeypatch, gpus: int) -> tuple[list[str], dict[int, str]]:
    """On a stand-in machine with ``gpus`` GPUs, launch_engine as it is (the GPU's start lock real) but starting a
    stand-in server process, and every wait for engines to serve, recorded as "launch MODEL" and "wait MODEL...":
    the events, and each port's model."""
    from vime_ext import evaluate

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: gpus)
    folder = www(tmp_path)
    events, models = [], {}
    start_server = servers.start_server

    def stand_in_server(name, command, host, port, env, log_dir):
        models[port] = command[command.index("--model") + 1]
        events.append(f"launch {models[port]}")
        return start_server("stand_in", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                         "--directory", folder], "127.0.0.1", port, {}, str(tmp_path / "logs"))

    def wait(started, timeout_s):
        events.append("wait " + " ".join(models[int(s.url.rsplit(":", 1)[1])] for s in started))
        wait_until_serving(started, timeout_s=timeout_s)

    monkeypatch.setattr(servers, "start_server", stand_in_server)
    monkeypatch.setattr(servers, "wait_until_serving", wait)
    monkeypatch.setattr(evaluate, "wait_until_serving", wait)
    return events, models


def test_a_reader_and_a_policy_with_fixed_caches_start_together(tmp_path, monkeypatch):
    """vime_ext.evaluate.served_together (an evaluation's model engine and its reward model's on one GPU): with
    fixed KV caches both are launched (launch_engine, real, taking the GPU's lock shared) before either is waited
    for; when one sizes its cache, the second is launched only once the first serves (else this process would
    wait for its own lock)."""
    from vime_ext import evaluate

    events, _ = recorded_launches(tmp_path, monkeypatch, gpus=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6")
    fixed = ["--kv-cache-memory-bytes", str(2**30)]
    for extra, expected in ((fixed, ["launch policy", "launch reader", "wait policy reader"]),
                            ([], ["launch policy", "wait policy", "launch reader", "wait policy reader"])):
        events.clear()
        with evaluate.served_together([(EngineConfig("policy", extra_args=extra), 1),
                                       (EngineConfig("reader", extra_args=extra), 1)], timeout_s=60) as urls:
            assert len(set(urls)) == 2
        assert events == expected


def test_a_failed_start_names_the_error_far_above_the_tail(tmp_path):
    """vLLM's engine core logs why it failed, then the API server's traceback fills the tail; the error raised
    carries both, and the GPU is free for the next engine."""
    log = textwrap.dedent("""
        import sys
        print("(EngineCore pid=1) ERROR 11-26 14:39:50 [core.py:843] EngineCore failed to start.")
        print("(EngineCore pid=1) ValueError: No available memory for the cache blocks.")
        for i in range(200):
            print(f"(APIServer pid=2)   File 'api_server.py', line {i}, in run_server_worker")
        print("(APIServer pid=2) RuntimeError: Engine core initialization failed. See root cause above.")
        sys.exit(1)
    """)
    server = stand_in(tmp_path, ["3"], lambda port: [sys.executable, "-c", log])
    with pytest.raises(RuntimeError) as error:
        wait_until_serving([server], timeout_s=60)
    text = str(error.value)
    assert "exited with code 1" in text
    assert text.index("No available memory for the cache blocks") < text.index("last output")
    assert "See root cause above" in text
    assert server.tries == 1  # not a failure another try fixes
    assert free_elsewhere("3")


def test_a_failed_start_whose_server_does_not_exit_is_stopped_and_reported(tmp_path):
    """A TP-2 vLLM engine on 2 x H200 logged that its engine core failed to start, and its API server stayed up,
    its workers hung: the wait stops such a server after the grace period instead of waiting for /health."""
    hang = textwrap.dedent("""
        import time
        print("(EngineCore pid=1) ERROR 11-27 20:13:47 [core.py:1330] EngineCore failed to start.", flush=True)
        print("(EngineCore pid=1) RuntimeError: Worker failed with error 'CUDA error'", flush=True)
        time.sleep(600)
    """)
    server = stand_in(tmp_path, ["5"], lambda port: [sys.executable, "-c", hang])
    started = time.time()
    with pytest.raises(RuntimeError) as error:
        wait_until_serving([server], timeout_s=120, failed_start_grace_s=2)
    assert time.time() - started < 60
    assert "failed to start and was still running 2 s later; stopped" in str(error.value)
    assert "Worker failed with error" in str(error.value)
    assert not server.alive() and free_elsewhere("5")


PROFILE_ERROR = ("(EngineCore pid=1) AssertionError: Error in memory profiling. Initial free memory 67.64 GiB, "
                 "current free memory 137.35 GiB. This happens when other processes sharing the same container "
                 "release GPU memory while vLLM is profiling during initialization.")


def flaky_server(tmp_path, fails: int) -> ServerProcess:
    """A stand-in on GPU 4 that dies of vLLM's profile-run error on its first ``fails`` starts, then serves
    /health."""
    folder = www(tmp_path)

    def command(port: int) -> list[str]:
        code = textwrap.dedent(f"""
            import os, pathlib, sys
            starts = pathlib.Path({str(tmp_path / "starts")!r})
            starts.write_text(str(int(starts.read_text()) + 1 if starts.exists() else 1))
            if int(starts.read_text()) <= {fails}:
                print({PROFILE_ERROR!r}, flush=True)
                sys.exit(1)
            # the server in this process, so that stopping it stops the server
            os.execv(sys.executable, [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1",
                                      "--directory", {folder!r}])
        """)
        return [sys.executable, "-c", code]

    return stand_in(tmp_path, ["4"], command)


def test_a_start_spoiled_by_another_process_freeing_memory_is_tried_again(tmp_path, capsys):
    """vLLM's profile-run error (another process on the GPU freed memory meanwhile) is what a second start fixes:
    the engine starts again on its port, its lock held throughout, and serves."""
    server = flaky_server(tmp_path, fails=1)
    try:
        wait_until_serving([server], timeout_s=60)
        assert server.tries == 2 and (tmp_path / "starts").read_text() == "2"
        assert "start 2 of 3" in capsys.readouterr().out
        log = server.log_path.read_text()
        assert "Error in memory profiling" in log and "start 2 of 3" in log  # both starts in one log
        assert free_elsewhere("4")  # released once it served
    finally:
        server.stop()


def test_a_start_that_keeps_failing_is_given_up_after_three(tmp_path):
    server = flaky_server(tmp_path, fails=5)
    with pytest.raises(RuntimeError) as error:
        wait_until_serving([server], timeout_s=60)
    assert server.tries == 3 and (tmp_path / "starts").read_text() == "3"
    assert "Error in memory profiling" in str(error.value)
    assert free_elsewhere("4")


def test_which_gpus_an_engine_uses(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the rule, on a machine without CUDA
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus(EngineConfig("m")) == ["0", "1", "2", "3"]
    assert engine_gpus(EngineConfig("m", env={"CUDA_VISIBLE_DEVICES": "2,3"})) == ["2", "3"]
    assert engine_gpus(EngineConfig("m", extra_args=["--tensor-parallel-size", "2"])) == ["0", "1"]
    assert engine_gpus(EngineConfig("m", env={"CUDA_VISIBLE_DEVICES": ""})) == []
    assert engine_gpus(EngineConfig("m", backend="hf", env={"CUDA_VISIBLE_DEVICES": "0"})) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert engine_gpus(EngineConfig("m")) == ["5"]
    assert tensor_parallel_size(["--tensor-parallel-size=4"]) == 4 and tensor_parallel_size(["-tp", "8"]) == 8
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert engine_gpus(EngineConfig("m", env={"CUDA_VISIBLE_DEVICES": "0"})) == []


def test_data_parallel_engines_each_get_gpus_of_their_own():
    """An evaluation's --num-engines: each copy on its own port and its own tensor-parallel slice of the visible
    GPUs, in order; too few GPUs is refused with the count; on CPUs the copies are not pinned."""
    config = EngineConfig("m", port=8000, extra_args=["--tensor-parallel-size", "2"], env={"A": "1"})
    two = data_parallel_configs(config, 2, ["2", "3", "5", "6"])
    assert [c.env for c in two] == [{"A": "1", "CUDA_VISIBLE_DEVICES": "2,3"}, {"A": "1", "CUDA_VISIBLE_DEVICES": "5,6"}]
    assert all(c.port == 0 and c.extra_args == config.extra_args for c in two)
    assert data_parallel_configs(config, 1, ["2", "3"]) == [config]
    with pytest.raises(ValueError, match="3 engines of 2 GPU\\(s\\) each need 6 GPUs; 4 visible"):
        data_parallel_configs(config, 3, ["2", "3", "5", "6"])
    assert [c.env for c in data_parallel_configs(config, 3, [])] == [{"A": "1"}] * 3
    with pytest.raises(ValueError, match="1 or more"):
        data_parallel_configs(config, 0, [])


def test_engines_sharing_gpus_start_one_after_another_on_each_and_come_back_in_order(tmp_path, monkeypatch):
    """servers.launch_engines, as the rollout manager starts --rollout-engines-per-gpu 2 on GPUs 0 and 1 (engines
    0 and 1 on GPU 0, 2 and 3 on GPU 1, each sizing its cache): the first engine on each GPU is launched (real
    launch_engine, each taking its GPU's lock), both are waited for, then the second on each; without that order
    this process would be refused its own GPU lock. The servers come back in the configs' order, which the weight
    push's routes follow."""
    events, names = recorded_launches(tmp_path, monkeypatch, gpus=2)
    configs = [EngineConfig(f"e{i}", env={"CUDA_VISIBLE_DEVICES": gpu}) for i, gpu in enumerate("0011")]
    started = []
    try:
        engines = servers.launch_engines(configs, started, timeout_s=60)
        assert events == ["launch e0", "launch e2", "wait e0 e2", "launch e1", "launch e3"]
        assert [names[int(e.url.rsplit(":", 1)[1])] for e in engines] == ["e0", "e1", "e2", "e3"]
        assert sorted(started, key=id) == sorted(engines, key=id)
        wait_until_serving(engines, timeout_s=60)
        assert all(e.start_lock is None for e in engines)
    finally:
        for engine in started:
            engine.stop()

