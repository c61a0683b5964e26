"""Training metrics reach TensorBoard, metrics.jsonl and (offline) Weights & Biases."""

import json

import pytest

from vime_ext.tracking import Tracker


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
    # The offline run file holds protobuf records; names and JSON-encoded values appear as bytes in them.
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    data = runs[0].read_bytes()
    for needle in (b"rollout/reward_mean", b"0.8125", b"train/loss", b"0.375", b"vime-test"):
        assert needle in data, needle
