"""tools/lease.sh, the background job and polls of a device lease, run here as on the GPU machine: the job outlives
the call that started it and leaves its exit status; a poll before the end says so and still brings back what a
person reads, never weights, checkpoints, data, saved rollouts or the real fact-consolidation episodes."""

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lease(tmp_path, *args):
    env = {**os.environ, "LEASE_OUT": str(tmp_path / "lease_out"), "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(ROOT / "tools/lease.sh"), *args], env=env, capture_output=True, text=True,
                          timeout=120, check=True).stdout


def members(out: Path, before: set) -> list[str]:
    (pack,) = set(out.glob("*.tgz")) - before
    return tarfile.open(pack).getnames()


def test_a_polled_job_returns_its_logs_and_results_but_no_weights(tmp_path):
    go, run = tmp_path / "go", tmp_path / "run"
    for name in ("results.jsonl", "data/train.jsonl", "iter_0000001/0_0.distcp", "hf/model.safetensors",
                 "eval_fact/rl_s0.samples.jsonl", "eval_fact/rl_s0.json", "seed_0/rl/rollouts/rollout_0.json",
                 "seed_0/rl/rollout_replies.jsonl.xz"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("x")
    (tmp_path / "out").mkdir()
    job = f"while [ ! -f {go} ]; do sleep 0.2; done; echo the last line; exit 3"
    assert "job started" in lease(tmp_path, "start", "job", "bash", "-c", job)

    polled = lease(tmp_path, "poll", "job", "0", str(run))
    assert "job still running" in polled
    names = members(tmp_path / "out", set())
    assert any(n.endswith("run/results.jsonl") for n in names)
    assert not any("/data" in n or "iter_" in n or "safetensors" in n for n in names), names
    # GRPO's saved rollouts (every token list) stay; their readable first and last come back
    assert not any("rollouts" in n for n in names) and any(n.endswith("rl/rollout_replies.jsonl.xz") for n in names)
    # the real fact-consolidation set's episodes quote its contexts (licence unknown): only their summary comes back
    assert any(n.endswith("eval_fact/rl_s0.json") for n in names) and not any(".samples" in n for n in names)

    before = set((tmp_path / "out").glob("*.tgz"))
    go.touch()
    polled = lease(tmp_path, "poll", "job", "60", str(run))
    assert "job done: exit 3" in polled and "the last line" in polled
    assert any(n.endswith("lease_out/job.log") for n in members(tmp_path / "out", before))
