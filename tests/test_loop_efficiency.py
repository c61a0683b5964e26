"""tools/loop_efficiency.py on metrics in the loop's format: the phase table, the ratios and the memory table."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.loop_efficiency import main  # noqa: E402


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ratios_and_memory_per_phase_from_the_medians_after_warmup(tmp_path, capsys):
    phases = {"time/rollout": 4.0, "time/train": 6.0, "time/log_probs": 1.0, "time/weight_sync": 0.5,
              "time/total": 12.5, "memory/rollout_device_used_gb": 70.0, "memory/rollout_allocated_gb": 0.1,
              "memory/train_device_used_gb": 60.0, "memory/train_allocated_gb": 40.0,
              "memory/train_reserved_gb": 44.0, "memory/train_peak_allocated_gb": 52.0}
    warmup = {k: v * 10 for k, v in phases.items()}  # step 0 is left out of the medians
    saved = {**phases, "time/save": 30.0, "time/total": 42.5}  # the step that saved is not a step's time
    loop = write_jsonl(tmp_path / "loop.jsonl", [{"step": 0, **warmup}, {"step": 1, **phases},
                                                 {"step": 2, **phases}, {"step": 3, **saved}])
    train_only = write_jsonl(tmp_path / "train_only.jsonl",
                             [{"step": 0, "time/train": 50.0}, {"step": 1, "time/train": 5.0,
                                                                "time/log_probs": 1.0}])
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps({"seconds": 4.0}))
    sync = tmp_path / "sync.json"
    sync.write_text(json.dumps({"push_s_median": 0.5}))
    summary = main(["--loop", str(loop), "--replay", str(replay), "--train-only", str(train_only),
                    "--weight-sync", str(sync)])
    assert summary["standalone_sum_s"] == 4.0 + 1.0 + 5.0 + 0.5 and summary["efficiency"] == 10.5 / 12.5
    assert summary["rollout_vs_standalone"] == 1.0
    assert summary["memory"]["train"] == {"allocated_gb": 40.0, "reserved_gb": 44.0, "peak_allocated_gb": 52.0,
                                          "device_used_gb": 60.0}
    assert summary["memory"]["rollout"]["reserved_gb"] is None
    out = capsys.readouterr().out
    assert "| train | 40.0 | 44.0 | 52.0 | 60.0 |" in out and "| rollout | 0.1 | - | - | 70.0 |" in out
    assert "loop efficiency 0.84" in out and "| save | checkpoint | 30.00 | - |" in out
