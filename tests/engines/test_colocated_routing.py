"""Colocated weight push over CUDA IPC on several GPUs: each engine gets, in one request per bucket, the handles of
full tensors on its own GPUs, keyed by those GPUs' UUIDs, from the trainer ranks placed beside it.

Four trainer ranks are gloo processes with stand-in devices (rank r plays GPU ``GPU_OF_RANK[r]``; a handle is a
copy of the tensor, so an engine can check what it would map). The engines are HTTP endpoints that record each
``/update_weights`` body as vLLM's IPC engine would read it: per tensor, the handle under each worker's GPU UUID.
Before this routing, every engine was handed one rank's handles of one GPU (issue 47's HTTP 500 "IPC handle not
found for GPU UUID")."""

import base64
import json
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import make_tiny_hf_dir, require_ranks
from tests.dist_workers import colocated_push
from vime_ext.gpu_sharing import GpuSharing, Mode, RankDevice
from vime_ext.trainer.launch import run_on_ranks

GPU_OF_RANK = [2, 0, 3, 1]  # not in rank order, so routing by rank alone would send handles to the wrong engine


class Recorder(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def engine_server() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def sharing(engine_tp: int, per_gpu: int = 1) -> GpuSharing:
    return GpuSharing(Mode.COLOCATED, on_gpu=True, rollout_gpus=4, gpus_per_engine=engine_tp,
                      sleep_level=1, engine_backend="vllm", requested_transport="auto", pipeline_size=1,
                      engines_per_gpu=per_gpu)


def test_placement_puts_each_engine_on_its_gpus_with_the_ranks_there():
    devices = [RankDevice("10.0.0.1", g) for g in GPU_OF_RANK]
    four = sharing(1).place_colocated(devices)
    assert four.gpus == ((0,), (1,), (2,), (3,)) and four.ranks == ((1,), (3,), (0,), (2,))
    two = sharing(2).place_colocated(devices)
    assert two.gpus == ((0, 1), (2, 3)) and two.ranks == ((1, 3), (0, 2))
    shared = sharing(2, per_gpu=2).place_colocated(devices)  # --rollout-engines-per-gpu 2: two engines a GPU pair
    assert shared.gpus == ((0, 1), (0, 1), (2, 3), (2, 3)) and shared.ranks == ((1, 3), (1, 3), (0, 2), (0, 2))
    with pytest.raises(ValueError, match="trainer ranks 0 and 1 both run on GPU 2"):
        sharing(1).place_colocated([RankDevice("n", 2), RankDevice("n", 2)])
    with pytest.raises(ValueError, match="trainer ranks on 2 nodes"):
        sharing(1).place_colocated([RankDevice("10.0.0.1", 0), RankDevice("10.0.0.2", 0)])


def test_each_engine_receives_full_tensors_of_its_own_gpus_only(tmp_path):
    require_ranks(4)
    hf_dir = make_tiny_hf_dir("qwen3", tmp_path / "qwen3", tokenizer=False, vocab_size=512)
    reference = load_file(hf_dir / "model.safetensors")
    devices = [RankDevice("10.0.0.1", g) for g in GPU_OF_RANK]
    servers, cases = {}, []
    # TP 2 x DP 2 and TP 2 x PP 2, each to four TP-1 engines and two TP-2 engines; TP 2 x DP 2 also to two TP-1
    # engines on each GPU (--rollout-engines-per-gpu 2), each of which must receive every tensor
    for tp, pp, engine_tp, per_gpu in ((2, 1, 1, 1), (2, 1, 2, 1), (2, 2, 1, 1), (2, 2, 2, 1), (2, 1, 1, 2)):
        name = f"tp{tp}_pp{pp}_engine_tp{engine_tp}_x{per_gpu}"
        placement = sharing(engine_tp, per_gpu).place_colocated(devices)
        servers[name] = [engine_server() for _ in placement.gpus]
        cases.append(dict(name=name, tp=tp, pp=pp, engine_tp=engine_tp, bucket_bytes=64 * 1024,
                          engine_ranks=[list(r) for r in placement.ranks], engine_gpus=placement.gpus,
                          urls=[f"http://127.0.0.1:{s.server_address[1]}" for s in servers[name]]))
    try:
        run_on_ranks(colocated_push, 4, str(tmp_path), str(hf_dir), cases, GPU_OF_RANK, isolate=True)
    finally:
        for group in servers.values():
            for server in group:
                server.shutdown()
    posted = [json.loads((tmp_path / f"posted_{r}.json").read_text()) for r in range(4)]
    for case in cases:
        for engine, (server, gpus, ranks) in enumerate(zip(servers[case["name"]], case["engine_gpus"],
                                                           case["engine_ranks"])):
            where = f"{case['name']}, engine {engine} on GPUs {gpus}"
            assert server.requests and {path for path, _ in server.requests} == {"/update_weights"}, where
            assert len(server.requests) > 1, f"{where}: one bucket only; the test means to cross bucket bounds"
            received = {}
            for _, body in server.requests:
                info = body["update_info"]
                handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
                assert len(handles) == len(info["names"]), where
                for name, dtype, size, by_gpu in zip(info["names"], info["dtype_names"], info["shapes"], handles):
                    assert sorted(by_gpu) == sorted(f"GPU-{g}" for g in gpus), f"{where}: {name} {sorted(by_gpu)}"
                    for copy in by_gpu.values():
                        assert str(copy.dtype) == f"torch.{dtype}" and list(copy.shape) == size, f"{where}: {name}"
                    assert name not in received, f"{where}: {name} sent twice"
                    received[name] = by_gpu
            assert sorted(received) == sorted(reference), where
            for name, by_gpu in received.items():
                for gpu, copy in by_gpu.items():
                    assert torch.equal(copy, reference[name]), f"{where}: {name} from {gpu} is not the full tensor"
            # The first rank on the engine's GPUs posts every bucket; the others only give their handles.
            assert posted[ranks[0]][case["name"]] == len(reference), where
            assert all(posted[r][case["name"]] == 0 for r in ranks[1:]), where


def test_rollout_stream_interval_reaches_the_vllm_engines_and_refuses_a_negative_one(tmp_path, tiny_hf_dirs):
    """--rollout-stream-interval N (default 64) starts vLLM engines with --stream-interval N (the client then asks
    for pieces), unless --vllm-stream-interval gave one; 0 gives none (whole replies); the transformers engine gets
    no such flag (it answers one piece)."""
    from vime_ext.arguments import ConfigError, parse_train_args
    from vime_ext.driver.rollout_manager import engine_args

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "1"}\n')
    base = ["--hf-checkpoint", str(tiny_hf_dirs["llama"]), "--prompt-data", str(data), "--engine-backend", "vllm"]
    config = parse_train_args(base + ["--rollout-stream-interval", "64"])
    assert engine_args(config, sharing(1), on_gpu=True)[-2:] == ["--stream-interval", "64"]
    given = parse_train_args(base + ["--rollout-stream-interval", "64", "--vllm-stream-interval", "16"])
    assert engine_args(given, sharing(1), on_gpu=True).count("--stream-interval") == 1
    assert engine_args(parse_train_args(base), sharing(1), on_gpu=True)[-2:] == ["--stream-interval", "64"]
    whole = parse_train_args(base + ["--rollout-stream-interval", "0"])
    assert "--stream-interval" not in engine_args(whole, sharing(1), on_gpu=True)
    hf = parse_train_args(base[:-1] + ["hf", "--rollout-stream-interval", "64"])
    assert "--stream-interval" not in engine_args(hf, sharing(1), on_gpu=False)
    with pytest.raises(ConfigError, match="--rollout-stream-interval must be 0"):
        parse_train_args(base + ["--rollout-stream-interval", "-1"])
