"""A user's plug-in module, outside the package, through train.py with Ray (and once more in one process): a
slime-signature generate that returns three sequences per trajectory (built with the trajectory builder), an async
reward reading its settings from --custom-config-path (one filled from the environment), both
--trajectory-advantage settings; then the saved rollout replayed into training without an engine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vime_ext.data.synthetic import write_jsonl

AGENT = '''
from vime_ext.agent.trajectory import Trajectory


async def generate(args, sample, sampling_params, evaluation=False):
    """args.num_chats independent conversations about the prompt, one training sequence each."""
    out = []
    for k in range(args.num_chats):
        chat = Trajectory(args.tokenizer, [{"role": "user", "content": f"{sample.prompt} Part {k}."}])
        await chat.generate(args.rollout_client, sampling_params, session_id=f"{sample.index}-{k}")
        out.append(chat.to_sample(sample))
    return out


async def reward(args, sample):
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    share = sum(t % 2 == 0 for t in response) / max(len(response), 1)
    return {"reward": args.reward_scale * share, "chats": float(len(sample.turns) + 1)}
'''

CONFIG = "num_chats: 3\nreward_scale: ${VIME_TEST_REWARD_SCALE:-1.0}\n"


def run(cwd: Path, args: list[str], log: Path) -> None:
    """train.py as a user runs it from ``cwd``, without PYTHONPATH: plug-ins are found from the launch directory."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(VIME_TEST_REWARD_SCALE="2.0", VIME_EXT_LOG_DIR=str(log.parent / "engines"))
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "vime_ext.train", *args], cwd=cwd, stdout=out,
                              stderr=subprocess.STDOUT, env=env, timeout=1200)
    assert done.returncode == 0, log.read_text()[-4000:]


def rows(tensorboard: Path) -> dict[int, dict]:
    lines = [json.loads(line) for line in (tensorboard / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in lines}


def trajectory_advantages(saved: Path) -> list[float]:
    """GRPO advantages (reward minus group mean, over the group's std) recomputed from a saved rollout."""
    import torch

    groups = json.loads(saved.read_text())["groups"]
    out = []
    for group in groups:
        rewards = torch.tensor([s["reward"] for s in group], dtype=torch.float32)
        out += ((rewards - rewards.mean()) / (rewards.std() + 1e-6)).tolist()
    return out


@pytest.mark.slow
def test_a_plugin_module_outside_the_package_trains_through_ray(tmp_path):
    from tests.train.test_train_loop import tiny_model_dir

    workdir = tmp_path / "launch"
    workdir.mkdir()
    (workdir / "my_agent.py").write_text(AGENT)
    (workdir / "agent.yaml").write_text(CONFIG)
    model = tiny_model_dir(tmp_path)
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 8)
    common = ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
              "--n-samples-per-prompt", "4", "--rollout-max-response-len", "6", "--num-rollout", "1",
              "--custom-generate-function-path", "my_agent.generate", "--custom-rm-path", "my_agent.reward",
              "--custom-config-path", "agent.yaml", "--engine-backend", "hf", "--rollout-seed", "5",
              "--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01"]
    result = {}
    for mode in ("shared", "split"):  # through Ray, then in one process (the same rollout: same seeds)
        run(workdir, common + ["--trajectory-advantage", mode, "--tensorboard-dir", str(tmp_path / mode),
                               "--save-debug-rollout-data", str(tmp_path / mode / "rollouts")]
            + (["--no-ray"] if mode == "split" else []), tmp_path / f"{mode}.log")
        result[mode] = rows(tmp_path / mode)
    saved = {mode: json.loads((tmp_path / mode / "rollouts/rollout_0.json").read_text()) for mode in result}
    # Same seeds, same first rollout: the same tokens and rewards; the log-probs to float rounding (the engine's
    # threads differ between a Ray worker's child and this process's).
    logprobs = {mode: [] for mode in saved}
    for mode, rollout in saved.items():
        for sample in (s for g in rollout["groups"] for s in g):
            for part in [sample, *sample["turns"]]:
                logprobs[mode] += part.pop("rollout_log_probs")
    assert saved["shared"]["groups"] == saved["split"]["groups"]
    assert logprobs["shared"] == pytest.approx(logprobs["split"], rel=1e-5, abs=1e-6)
    samples = [s for g in saved["shared"]["groups"] for s in g]
    assert all(len(s["turns"]) == 2 and s["response_length"] > 0 for s in samples)  # three sequences each
    for mode, metrics in result.items():
        first = metrics[0]
        assert first["train/sequences"] == 3 * len(samples) == 24
        assert first["rollout/chats"] == 3.0 and first["rollout/sequences_per_sample"] == 3.0
        # The reward read its scale (2.0, from the environment through the YAML file).
        share = [s["reward"] / 2.0 for s in samples]
        assert all(0.0 <= x <= 1.0 for x in share) and max(share) > 0
        assert first["rollout/reward_mean"] == pytest.approx(sum(s["reward"] for s in samples) / len(samples))
    # Every sequence carries its trajectory's advantage (shared) or a third of it (split).
    expected = sum(abs(a) for a in trajectory_advantages(tmp_path / "shared/rollouts/rollout_0.json")) / 8
    assert expected > 0
    assert result["shared"][0]["rollout/advantage_abs_mean"] == pytest.approx(expected, rel=1e-5)
    assert result["split"][0]["rollout/advantage_abs_mean"] == pytest.approx(expected / 3, rel=1e-5)
    assert result["split"][0]["train/loss"] != pytest.approx(result["shared"][0]["train/loss"])

    # Replay: the saved rollout trains again without an engine, to the same loss and gradient norm.
    run(workdir, common[:common.index("--num-rollout")] + [
        "--num-rollout", "1", "--no-ray", "--custom-rm-path", "my_agent.reward", "--custom-config-path",
        "agent.yaml", "--lr", "1e-3", "--use-kl-loss", "--kl-loss-coef", "0.01",
        "--load-debug-rollout-data", str(tmp_path / "shared/rollouts"), "--debug-train-only",
        "--tensorboard-dir", str(tmp_path / "replay")], tmp_path / "replay.log")
    replay, original = rows(tmp_path / "replay")[0], result["shared"][0]
    for key in ("train/loss", "train/pg_loss", "train/kl", "train/grad_norm", "rollout/reward_mean"):
        assert replay[key] == pytest.approx(original[key], rel=1e-6, abs=1e-9), key
    assert "time/weight_sync" not in replay or replay["time/weight_sync"] == 0.0

    # The other policy losses on the split rollout (three sequences per trajectory, each with a third of the
    # trajectory's advantage). One step per rollout, so the ratio is 1 everywhere, and then: GSPO's gradient is
    # PPO's under seq_mean_token_mean only if each training sequence gets its own sequence ratio (one ratio per
    # trajectory would average its three sequences' tokens together); CISPO's gradient (a detached weight of 1
    # on the log-prob) is PPO's under any aggregation.
    losses = {"ppo": [], "gspo": ["--policy-loss", "gspo"], "cispo": ["--policy-loss", "cispo"]}
    for name, flags in losses.items():
        run(workdir, common[:common.index("--num-rollout")] + [
            "--num-rollout", "1", "--no-ray", "--custom-rm-path", "my_agent.reward", "--custom-config-path",
            "agent.yaml", "--lr", "1e-3", "--trajectory-advantage", "split", "--loss-aggregation",
            "seq_mean_token_mean", *flags, "--load-debug-rollout-data", str(tmp_path / "split/rollouts"),
            "--debug-train-only", "--tensorboard-dir", str(tmp_path / f"split_{name}")], tmp_path / f"{name}.log")
    split = {name: rows(tmp_path / f"split_{name}")[0] for name in losses}
    assert split["ppo"]["rollout/advantage_abs_mean"] == pytest.approx(expected / 3, rel=1e-5)
    for name in ("gspo", "cispo"):
        assert split[name]["train/grad_norm"] == pytest.approx(split["ppo"]["train/grad_norm"], rel=1e-5), name
    assert split["gspo"]["train/pg_loss"] == pytest.approx(split["ppo"]["train/pg_loss"], rel=1e-5)
    assert split["ppo"]["train/grad_norm"] > 0


def test_dynamic_sampling_with_a_group_reward_in_a_rollout_only_run(tmp_path):
    """--debug-rollout-only (no trainer) with --group-rm and the all-equal filter: every kept group has rewards
    that differ, the rollout still has --rollout-batch-size groups numbered by position, and the saved rollout
    is what was logged."""
    from tests.train.test_train_loop import ROOT, tiny_model_dir

    model = tiny_model_dir(tmp_path)
    data = tmp_path / "labels.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "label": "same" if i % 3 else "vary"}) + "\n"
                            for i in range(9)))  # one prompt in three can be learned from
    run(ROOT, ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
               "--n-samples-per-prompt", "2", "--rollout-max-response-len", "3", "--num-rollout", "1",
               "--no-ray", "--engine-backend", "hf", "--debug-rollout-only", "--group-rm",
               "--custom-rm-path", "tests.train.toy_rewards.label_decides_the_group",
               "--dynamic-sampling-filter-path", "vime_ext.rollout.filters.check_reward_nonzero_std",
               "--over-sampling-batch-size", "3", "--save-debug-rollout-data", str(tmp_path / "r_{rollout_id}.json"),
               "--tensorboard-dir", str(tmp_path / "tb")], tmp_path / "run.log")
    saved = json.loads((tmp_path / "r_0.json").read_text())
    groups = saved["groups"]
    assert len(groups) == 2
    assert [[(s["group_index"], s["index"]) for s in g] for g in groups] == [[(0, 0), (0, 1)], [(1, 2), (1, 3)]]
    assert all(g[0]["label"] == "vary" and [s["reward"] for s in g] == [0.0, 1.0] for g in groups)
    logged = rows(tmp_path / "tb")[0]
    assert logged["rollout/dynamic_sampling_drawn"] == 6 == saved["metrics"]["dynamic_sampling_drawn"]
    assert logged["rollout/reward_mean"] == 0.5 and "train/loss" not in logged


def test_custom_config_reads_environment_references(tmp_path, monkeypatch):
    """Whole-string references become numbers or None (``null``); text stays text; a missing variable without a
    default is named with its file and key."""
    from vime_ext.rollout.plugins import load_custom_config

    config = tmp_path / "agent.yaml"
    config.write_text("scale: ${VT_SCALE:-1.5}\nturns: ${VT_TURNS:-30}\noptional: ${VT_OPT:-null}\n"
                      "prefix: ${VT_PREFIX:-}\nlabel: run-${VT_TURNS:-30}\n")
    assert load_custom_config(str(config), set()) == {"scale": 1.5, "turns": 30, "optional": None, "prefix": "",
                                                      "label": "run-30"}
    monkeypatch.setenv("VT_OPT", "-0.2")
    assert load_custom_config(str(config), set())["optional"] == -0.2
    config.write_text("needed: ${VT_NEEDED}\n")
    with pytest.raises(ValueError, match=r"agent.yaml, key needed: environment variable VT_NEEDED is not set"):
        load_custom_config(str(config), set())
