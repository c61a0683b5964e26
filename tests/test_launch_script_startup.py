"""A GPU recipe's launch script started for real on the CPU: MemAgent's ``run-qwen3-4b-train.sh`` with its
variables pointing at a tiny model, with no stand-ins: the script starts a Ray head with the real ``ray``
binary, the real ``train.py`` joins it (the path that failed on GPUs when the driver asked a running cluster for
CPUs), trains two GRPO rollouts, saves, and the script stops Ray when it exits. The transformers engine stands
in for vLLM only because it starts in seconds on two cores; the engine is not what this test is about."""

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_tiny_hf_dir, run_launch_script
from vime_ext.net import free_port


def ray_running(port: int) -> bool:
    """Whether a Ray GCS server listens for a head on ``port`` (its process names the port)."""
    return subprocess.run(["pgrep", "-f", f"gcs_server.*port={port}"], capture_output=True).returncode == 0


@pytest.mark.slow
def test_qwen3_4b_script_starts_ray_and_trains_on_the_cpu(tmp_path, monkeypatch):
    model = make_tiny_hf_dir("llama", tmp_path / "tiny", seed=3, cache_dir=tmp_path, hidden_size=128,
                             max_position_embeddings=2048)
    data = tmp_path / "data"
    subprocess.run([sys.executable, "-m", "examples.mem_agent.prepare_data", "--generate", "--num", "16",
                    "--num-docs", "2", "--hops", "1", "--seed", "0", "--out", str(data / "train.jsonl")],
                   check=True, cwd=Path(__file__).resolve().parents[1], capture_output=True)
    port = free_port()
    env = {"HF_CKPT": str(model), "TRAIN_DATA": str(data / "train.jsonl"), "SAVE_PATH": str(tmp_path / "ckpt"),
           "MODEL_ARGS_SCRIPT": "", "NUM_ROLLOUT": "2", "ROLLOUT_BATCH_SIZE": "2", "N_SAMPLES_PER_PROMPT": "2",
           "GLOBAL_BATCH_SIZE": "4", "MEM_CHUNK_TOKENS": "64", "MEM_MAX_MEMORY": "8", "MEM_MAX_FINAL": "8",
           "RAY_PORT": str(port), "VIME_EXT_LOG_DIR": str(tmp_path / "engines")}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the script starts its own head
    before = set(Path("/tmp").glob("vime_ext_ray.*"))  # another run's, killed before its exit trap ran
    output = run_launch_script("examples/mem_agent/run-qwen3-4b-train.sh", env, tmp_path,
                               args=("--engine-backend", "hf", "--lr", "1e-4",
                                     "--save-debug-rollout-data", str(tmp_path / "rollouts")))
    assert f"starting a Ray head on 127.0.0.1:{port}" in output
    assert "layout: 1 node(s) x 1 trainer GPU(s), TP 1, engines colocated, optimizer offload 0" in output
    rows = [json.loads(line) for line in (tmp_path / "ckpt/tensorboard/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    # A random tiny model earns no reward, so the gradient may be ~0; that the steps ran and pushed is the point.
    assert all(r["train/sequences"] >= 4 and math.isfinite(r["train/grad_norm"]) and "time/weight_sync" in r
               for r in rows)
    assert (tmp_path / "ckpt/latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (tmp_path / "tiny_torch_dist/latest_checkpointed_iteration.txt").is_file()  # --ref-load
    assert not ray_running(port)  # stopped when the script exited
    assert set(Path("/tmp").glob("vime_ext_ray.*")) <= before  # with its temporary folder

    # The loop against its parts (tools/loop_efficiency.py): the saved rollout 1 replayed on an engine alone,
    # the saved rollouts through the trainer alone, and the table.
    root = Path(__file__).resolve().parents[1]
    replay = tmp_path / "replay.json"
    subprocess.run([sys.executable, "tools/replay_rollout.py", "--rollout-data", str(tmp_path / "rollouts"),
                    "--rollout-id", "1", "--hf-checkpoint", str(model), "--engine-backend", "hf", "--out",
                    str(replay)], check=True, cwd=root, capture_output=True, timeout=600)
    from vime_ext.rollout.debug_data import load_rollout

    groups, _ = load_rollout(str(tmp_path / "rollouts"), 1)
    saved = [s for g in groups for s in g]
    figures = json.loads(replay.read_text())
    assert figures["samples"] == 4 and figures["seconds"] > 0
    assert figures["stream_interval"] == 64  # replies asked for as the loop asked (the transformers engine: one piece)
    assert figures["sequences"] == sum(len(s.turns) + 1 for s in saved)
    assert figures["generated_tokens"] == sum(s.response_length + sum(len(t.loss_mask) for t in s.turns)
                                              for s in saved)  # every length reproduced
    train_only = tmp_path / "train_only"
    subprocess.run([sys.executable, "train.py", "--hf-checkpoint", str(model), "--prompt-data",
                    str(data / "train.jsonl"), "--no-ray", "--debug-train-only", "--load-debug-rollout-data",
                    str(tmp_path / "rollouts"), "--num-rollout", "2", "--rollout-batch-size", "2",
                    "--n-samples-per-prompt", "2", "--global-batch-size", "4", "--lr", "1e-4",
                    "--tensorboard-dir", str(train_only)], check=True, cwd=root, capture_output=True, timeout=600)
    done = subprocess.run([sys.executable, "tools/loop_efficiency.py", "--loop",
                           str(tmp_path / "ckpt/tensorboard/metrics.jsonl"), "--replay", str(replay),
                           "--train-only", str(train_only / "metrics.jsonl")], cwd=root, capture_output=True,
                          text=True, timeout=120, check=True)
    assert "| rollout | generation |" in done.stdout and "| train | optimizer steps |" in done.stdout
    assert "loop efficiency" in done.stdout and "not measured standalone: weight_sync" in done.stdout


def test_a_ray_port_already_taken_is_refused_with_its_number(tmp_path, monkeypatch):
    # Seeds' heads once sat one port apart: a head's client server (RAY_PORT + 1) took the next seed's GCS port,
    # and that seed's `ray start` failed with a gRPC "Method not found" that named no port.
    port = free_port()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 2))
        held.listen()
        result = subprocess.run(["bash", "-c", f'source _common.sh && RAY_PORT={port} start_ray; echo "rc=$?"'],
                                cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip().splitlines()[-1] == "rc=2"
    assert f"RAY_PORT={port}: port {port + 2} is in use" in result.stderr
    assert not ray_running(port)


def test_a_stopped_head_leaves_no_process_and_frees_its_ports(monkeypatch):
    # A head's client server (RAY_PORT + 1) and its agents do not name the head's temporary folder, and once
    # outlived stop_ray: the same script run again on its RAY_PORT (a run resumed after a crash) was refused.
    port = free_port()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    script = (f'source _common.sh && RAY_PORT={port} start_ray && echo "sid=$VIME_EXT_RAY_SID" '
              '&& pgrep -s "$VIME_EXT_RAY_SID" | wc -l && stop_ray')
    result = subprocess.run(["bash", "-c", script],
                            cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    sid, started = result.stdout.strip().splitlines()[-2:]
    assert sid.startswith("sid=") and int(started) >= 5  # GCS, raylet, client server, agents, monitors
    left = subprocess.run(["pgrep", "-s", sid.removeprefix("sid=")], capture_output=True, text=True).stdout.split()
    assert left == []
    for p in range(port, port + 3):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("0.0.0.0", p))  # raises where a process of the head still listens
