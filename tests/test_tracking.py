"""Training metrics reach TensorBoard, metrics.jsonl and (offline) Weights & Biases."""

import json
import subprocess
import sys

import pytest

from vime_ext.tracking import Tracker


def wandb_records(wandb_dir) -> list[dict]:
    """The records of the one offline run under ``wandb_dir``, as W&B's own reader of transaction logs
    (``wandb leet inspect --json``, which runs wandb-core's reader) prints them."""
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_dir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_metrics_reach_tensorboard_jsonl_and_wandb(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: the run is written locally, as `wandb sync` expects
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracker(str(tmp_path / "tb"), use_wandb=True, wandb_project="vime-test", config={"lr": 1e-6})
    tracker.log({"rollout/reward_mean": 0.25, "train/loss": 1.5}, 0, {"prompts": ["a", "b"]})
    tracker.log({"rollout/reward_mean": 0.8125, "train/loss": 0.375}, 1)
    tracker.close()

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.value for e in events.Scalars("rollout/reward_mean")] == [0.25, 0.8125]
    rows = [json.loads(line) for line in (tmp_path / "tb" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 0, "rollout/reward_mean": 0.25, "train/loss": 1.5, "prompts": ["a", "b"]}
    # close() returned, so the run is complete on disk: read it back with W&B's reader, no waiting.
    assert len(list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))) == 1
    records = wandb_records(tmp_path / "wandb")
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["project"] == "vime-test" and run["config"]["update"]["lr"] == 1e-6
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [(h["_step"], h["rollout/reward_mean"], h["train/loss"]) for h in history] == [(0, 0.25, 1.5),
                                                                                          (1, 0.8125, 0.375)]
    assert [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"] == [0]
