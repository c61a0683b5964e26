"""tools/bench_peers.py without a GPU: the workload's prompts are exactly as long as it says under the real
tokenizer, this project's GPU command passes train.py's parser, and a run's per-step metrics become its figures
and the table."""

import functools
import json

import pytest
import torch

from tools.bench_peers import RUNNERS, WORKLOADS, result, table, vime_ext_command, write_prompts
from vime_ext.arguments import build_parser


def test_w1_prompts_are_exactly_256_qwen_tokens(tmp_path):
    from transformers import AutoTokenizer

    from vime_ext.models.packaged import qwen_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    w1 = WORKLOADS["w1"]
    rows = [json.loads(line) for line in write_prompts(tokenizer, w1, tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(rows) == 32 and len({r["prompt"] for r in rows}) == 32
    assert {len(tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]) for r in rows} == {256}
    assert w1.tokens_per_step == 32 * 8 * (256 + 1024)


def test_the_gpu_command_passes_train_py_s_parser(tmp_path, tiny_hf_dirs):
    from vime_ext.arguments import parse_train_args
    from vime_ext.engines.servers import flag_value, split_vllm_args
    from vime_ext.gpu_sharing import GpuSharing, Mode

    def command_of(runner: str | None, model=tmp_path / "model") -> list[str]:
        """The command a runner runs (its flags given to vime_ext_command, as run_vime_ext does), train.py's part."""
        flags = RUNNERS[runner].keywords["flags"] if runner else ()
        return vime_ext_command(WORKLOADS["w1"], model, tmp_path / "p.jsonl", tmp_path, gpu=True, flags=flags)[3:]

    own, engine = split_vllm_args(command_of(None))
    args = build_parser().parse_args(own)
    assert (args.rollout_batch_size, args.n_samples_per_prompt, args.rollout_max_response_len) == (32, 8, 1024)
    assert args.global_batch_size == 256 and args.num_rollout == 7 and args.colocate and not args.use_kl_loss
    assert args.rollout_log_probs  # as TRL asks vLLM for them; the second row of this project goes without
    # TRL's engine settings: asleep at level 2, prefill in chunks of 4,096 tokens
    assert args.engine_sleep_level == 2 and engine == ["--max-num-batched-tokens", "4096"]
    assert args.rollout_stream_interval == 64  # the default: replies in pieces
    assert not build_parser().parse_args(split_vllm_args(command_of("vime_ext_no_log_probs"))[0]).rollout_log_probs
    own, engine = split_vllm_args(command_of("vime_ext_4_api_servers"))
    assert engine[-2:] == ["--api-server-count", "4"] and build_parser().parse_args(own).colocate
    assert build_parser().parse_args(split_vllm_args(command_of("vime_ext_whole"))[0]).rollout_stream_interval == 0

    (tmp_path / "p.jsonl").write_text('{"prompt": "x", "label": ""}\n')
    real = functools.partial(command_of, model=tiny_hf_dirs["qwen3"])
    resident = parse_train_args(real("vime_ext_resident"))  # resident engines never sleep: no level asked for
    assert GpuSharing.from_config(resident, on_gpu=True).mode is Mode.RESIDENT
    state = parse_train_args(real("vime_ext_state_resident"))
    assert not state.cluster.offload_optimizer_state and state.cluster.offload_train
    halved = parse_train_args(real("vime_ext_state_resident_mb8k"))
    assert not halved.cluster.offload_optimizer_state and halved.trainer.max_tokens_per_gpu == 8192  # the later flag
    beside = parse_train_args(real("vime_ext_resident_mb4608"))  # W2: two 2,304-token sequences a pass
    assert GpuSharing.from_config(beside, on_gpu=True).mode is Mode.RESIDENT
    assert beside.trainer.max_tokens_per_gpu == 4608
    larger = parse_train_args(real("vime_ext_mb32k"))
    assert larger.trainer.max_tokens_per_gpu == 32768 and larger.cluster.offload_optimizer_state
    # two engines on the one GPU, each in half the share (run_vime_ext adds the bench's share, 0.5: 0.25 each)
    two = parse_train_args(real("vime_ext_2_engines") + ["--vllm-gpu-memory-utilization", "0.5"])
    sharing = GpuSharing.from_config(two, on_gpu=True)
    assert sharing.mode is Mode.COLOCATED and sharing.num_engines == 2 and two.cluster.router_policy == "round_robin"
    assert flag_value(sharing.engine_args(list(two.vllm_args), True), "--gpu-memory-utilization") == "0.25"
    three = GpuSharing.from_config(parse_train_args(real("vime_ext_3_engines")), on_gpu=True)
    assert three.num_engines == 3 and three.mode is Mode.COLOCATED
    beside = GpuSharing.from_config(parse_train_args(real("vime_ext_2_engines_resident")), on_gpu=True)
    assert beside.mode is Mode.RESIDENT and beside.num_engines == 2
    kept = parse_train_args(real("vime_ext_2_engines_state_resident"))
    assert GpuSharing.from_config(kept, on_gpu=True).num_engines == 2 and not kept.cluster.offload_optimizer_state
    both = parse_train_args(real("vime_ext_2_engines_state_resident_mb8k"))
    assert GpuSharing.from_config(both, on_gpu=True).num_engines == 2 and not both.cluster.offload_optimizer_state
    assert both.trainer.max_tokens_per_gpu == 8192
    quiet = parse_train_args(real("vime_ext_2_engines_no_log_probs"))
    assert GpuSharing.from_config(quiet, on_gpu=True).num_engines == 2 and not quiet.rollout.rollout_log_probs
    assert "--no-enable-prefix-caching" in parse_train_args(real("vime_ext_no_prefix_caching")).vllm_args
    assert parse_train_args(real(None)).trainer.compile_log_probs
    assert not parse_train_args(real("vime_ext_eager_log_probs")).trainer.compile_log_probs
    ahead = parse_train_args(real("vime_ext_async"))
    assert ahead.rollout.async_training and ahead.rollout.max_staleness == 1
    assert ahead.data.num_rollout == WORKLOADS["w1"].steps + 1  # its last step, with nothing beside it, untimed
    assert ahead.cluster.engine_sleep_level == 1  # resident engines never sleep: no level asked for
    assert GpuSharing.from_config(ahead, on_gpu=True).mode is Mode.RESIDENT


def test_result_leaves_the_warm_up_out_and_the_table_compares_with_the_fastest_trl_row():
    """result() and table() on per-step metrics as train.py logs them (the tiny workload ran end to end on this
    machine by hand: ``python tools/bench_peers.py --workload tiny --model-dir TINY --out OUT``)."""
    tiny = WORKLOADS["tiny"]
    steps = [{"time/total": 9.0, "time/rollout": 5.0}] + [
        {"time/total": t, "time/rollout": t / 2, "time/train": t / 4, "time/save": 0.0,
         "memory/train_peak_allocated_gb": 3.0 + i} for i, t in enumerate((2.0, 4.0))]
    ours = result("vime_ext", tiny, steps, gpus=1, wall=20.0)
    assert ours["step_s"] == 3.0 and ours["phases"]["generate"] == 1.5 and ours["peak_gpu_gb"] == 4.0
    assert ours["tokens_per_s_per_gpu"] == pytest.approx(tiny.tokens_per_step / 3.0)
    trl = {**ours, "framework": "trl", "step_s": 6.0, "tokens_per_s_per_gpu": ours["tokens_per_s_per_gpu"] / 2}
    slower_trl = {**trl, "framework": "trl_defaults", "tokens_per_s_per_gpu": ours["tokens_per_s_per_gpu"] / 4}
    rows = table([ours, trl, slower_trl]).splitlines()
    assert rows[2].startswith("| vime_ext | 3.00 |") and rows[3].startswith("| trl | 6.00 |")
    assert rows[2].endswith("| 2.00x |") and rows[3].endswith("| 1.00x |") and rows[4].endswith("| 0.50x |")
    assert table([ours]).splitlines()[2].endswith("| 4.0 |  |")  # no TRL row: nothing to compare with
    with pytest.raises(ValueError, match="2 steps logged, the workload has 3"):
        result("vime_ext", tiny, steps[:2], gpus=1, wall=1.0)
    # TRL's count holds the sleeping engine's pool (vLLM frees its memory behind torch's back): taken off
    trl_steps = [{"time/total": 5.0, "memory/peak_allocated_gb": 171.4, "memory/engine_pool_gb": 42.0}] * 3
    assert result("trl", tiny, trl_steps, gpus=1, wall=1.0)["peak_gpu_gb"] == pytest.approx(129.4)


def test_list_names_every_row_with_the_flags_it_adds(capsys):
    from tools.bench_peers import main

    assert main(["--list"]) == 0
    rows = dict(line.split(": ", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert list(rows) == list(RUNNERS)
    assert rows["vime_ext"] == "vime_ext" and rows["verl_bypass"] == "verl (bypass mode)"
    assert rows["vime_ext_2_engines_state_resident_mb8k"] == (
        "vime_ext --rollout-engines-per-gpu 2 --router-policy round_robin --no-offload-optimizer-state "
        "--max-tokens-per-gpu 8192")
    assert rows["trl_no_checkpointing_mb16"] == "trl --no-gradient-checkpointing --micro-batch 16"


def test_the_table_rebuilds_a_run_cut_off_before_its_result_from_its_metrics(tmp_path, capsys):
    """A lease that ends as a run logs its last step leaves no result file (W2's streamed row, 2026-11-30):
    ``--table`` makes that row from the run's metrics file, as the bench would have, and says so; a folder
    without steps, or not a framework's, adds nothing."""
    from tools.bench_peers import main

    tiny = WORKLOADS["tiny"]  # 1 warm-up step, 2 timed
    ours = result("vime_ext", tiny, [{"time/total": 5.0}] * 3, gpus=1, wall=9.0)
    (tmp_path / "vime_ext.result.json").write_text(json.dumps(ours))
    logged = tmp_path / "vime_ext_whole" / "vime_ext_tb"
    logged.mkdir(parents=True)
    (logged / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 0, "time/total": 9.0}, {"step": 0, "perf/tokens": 1.0},  # train.py's other lines are skipped
        {"step": 1, "time/total": 10.0, "time/rollout": 6.0}, {"step": 2, "time/total": 12.0, "time/rollout": 7.0}]))
    (tmp_path / "trl").mkdir()  # started, no step yet
    (tmp_path / "engines").mkdir()  # not a framework's
    assert main(["--table", "--out", str(tmp_path), "--workload", "tiny"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 4 and rows[2].startswith("| vime_ext | 5.00 |")
    assert rows[3].startswith("| vime_ext_whole (cut off before its result, from its metrics file: 2 of 2 timed "
                              "steps) | 11.00 |") and rows[3].endswith("|  |")  # no TRL row
    assert not (tmp_path / "vime_ext_whole.result.json").exists()  # the table writes no result
    assert (tmp_path / "phases.png").read_bytes().startswith(b"\x89PNG")  # and draws the rows


def test_the_trl_rows_run_with_and_without_its_default_gradient_checkpointing(tmp_path):
    """TRL's GRPOConfig recomputes activations by default; the trl_no_checkpointing row asks it not to (both ran
    the tiny workload on this CPU by hand, TRL 1.16 from the GPU wheel set: their trl_settings.json say so)."""
    from tools import bench_trl

    base = ["--model-dir", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path)]
    assert bench_trl.build_parser().parse_args(base).gradient_checkpointing
    flags = RUNNERS["trl_no_checkpointing"].keywords["flags"]
    assert not bench_trl.build_parser().parse_args(base + list(flags)).gradient_checkpointing
    larger = bench_trl.build_parser().parse_args(base + list(RUNNERS["trl_no_checkpointing_mb16"].keywords["flags"]))
    assert not larger.gradient_checkpointing and larger.micro_batch == 16 and WORKLOADS["w1"].prompts * 8 % 16 == 0
    for n in (2, 4):  # W2's: passes of 4,608 and 9,216 tokens, each dividing its 64 completions
        flags = RUNNERS[f"trl_no_checkpointing_mb{n}"].keywords["flags"]
        smaller = bench_trl.build_parser().parse_args(base + list(flags))
        assert not smaller.gradient_checkpointing and smaller.micro_batch == n
        assert WORKLOADS["w2"].prompts * WORKLOADS["w2"].samples % n == 0


def test_the_phase_plot_stacks_sequential_phases_and_sets_overlapping_ones_side_by_side(tmp_path, monkeypatch):
    """The sync row's phases end to end (its rest grey), the async row's from 0 each (they overlap: their sum is
    above the step), a failed row left out."""
    import matplotlib.axes

    from tools.bench_peers import failure, plot

    tiny = WORKLOADS["tiny"]
    sync = result("vime_ext", tiny, [{"time/total": 10.0, "time/rollout": 6.0, "time/train": 3.0}] * 3, 1, 9.0)
    ahead = result("vime_ext_async", tiny, [{"time/total": 7.0, "time/rollout": 6.5, "time/train": 5.0}] * 3, 1, 9.0)
    bars = []
    original = matplotlib.axes.Axes.barh
    monkeypatch.setattr(matplotlib.axes.Axes, "barh", lambda self, y, width, left=0.0, **kw: bars.append(
        (y, width, left)) or original(self, y, width, left=left, **kw))
    plot([sync, ahead, failure("trl", RuntimeError("no vLLM"))], tmp_path / "phases.png")
    assert (tmp_path / "phases.png").read_bytes().startswith(b"\x89PNG")
    drawn = [b for b in bars if b[1] > 0]
    # rows bottom-up: the async row (y near 0), then the sync row (y = 1)
    assert sorted((w, left) for y, w, left in drawn if y == 1) == [(1.0, 9.0), (3.0, 6.0), (6.0, 0.0)]
    assert sorted((w, left) for y, w, left in drawn if y != 1) == [(5.0, 0.0), (6.5, 0.0)]


def test_trl_scores_a_completion_as_this_project_does_and_its_untimed_phases_show_as_such():
    """tools/bench_trl.py's reward is the bench plug-in's on the same text; a row from TRL's steps (which time the
    generation and the weight sync, not the log-prob and training passes apart) shows those as "-", not 0."""
    from types import SimpleNamespace

    from tools.bench_plugins import reward
    from tools.bench_trl import hash_reward

    texts = ["river stone light", "", "Prompt 3: winter"]
    assert hash_reward(["p"] * 3, texts) == [reward(None, SimpleNamespace(response=t)) for t in texts]
    tiny = WORKLOADS["tiny"]
    steps = [{"time/total": t, "time/rollout": t / 2, "time/weight_sync": 0.1} for t in (9.0, 2.0, 4.0)]
    trl = result("trl", tiny, steps, gpus=1, wall=20.0)
    assert trl["phases"]["generate"] == 1.5 and trl["phases"]["train"] is None
    row = table([trl]).splitlines()[2]
    assert row.startswith("| trl | 3.00 |") and "| 1.50 | - | - | 0.10 | - |" in row


def test_verls_rows_come_from_its_file_logger_and_its_prompts_keep_their_exact_length(tmp_path):
    """tools/bench_verl.py without verl: the prompts, as verl renders them (its chat template replaced by one that
    writes the message as it is), are still exactly 256 Qwen tokens; verl's reward is the bench's on the same
    text; a line of verl's file logger becomes a bench row (phases it times under its own names), and a line
    without the step's timing is named by file and line."""
    import pandas as pd
    from transformers import AutoTokenizer

    from tools import bench_verl
    from tools.bench_plugins import text_reward
    from vime_ext.models.packaged import qwen_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
    prompts = write_prompts(tokenizer, WORKLOADS["w1"], tmp_path / "p.jsonl")
    frame = pd.read_parquet(bench_verl.write_parquet(prompts, tmp_path / "p.parquet"))
    tokenizer.chat_template = bench_verl.PLAIN_TEMPLATE
    lengths = {len(tokenizer.apply_chat_template(list(chat), add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"]) for chat in frame["prompt"]}
    assert len(frame) == 32 and lengths == {256}
    assert bench_verl.compute_score("bench", "river stone", "", {}) == text_reward("river stone")

    log = tmp_path / "verl.jsonl"
    timing = {"timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/old_log_prob": 1.0,
              "timing_s/update_actor": 2.5, "timing_s/update_weights": 0.5, "actor/perf/max_memory_allocated_gb": 30.0}
    log.write_text("".join(json.dumps({"step": s, "data": timing}) + "\n" for s in (1, 2, 3)))
    row = bench_verl.steps(log)[0]
    assert row["time/total"] == 10.0 and row["time/train"] == 2.5 and row["memory/actor_peak_allocated_gb"] == 30.0
    verl = result("verl", WORKLOADS["tiny"], bench_verl.steps(log), gpus=1, wall=40.0)
    assert verl["phases"] == {"generate": 6.0, "log-probs": 1.0, "train": 2.5, "weight sync": 0.5,
                              "sleep/wake": None}
    log.write_text(json.dumps({"step": 1, "data": {"timing_s/gen": 6.0}}) + "\n")
    with pytest.raises(ValueError, match=r"verl\.jsonl:1: no timing_s/step"):
        bench_verl.steps(log)


def test_verl_accepts_the_workload_as_its_own_config_checks_do(tmp_path):
    """verl's Hydra config composed with tools/bench_verl.py's overrides passes verl's own validate_config: every
    key exists and the batch sizes agree for one GPU. Needs verl 0.9.1's set (``$VERL_SITE``,
    ``tools/gpu_wheels.py --verl``); CI has none, so this runs where it is installed."""
    import os
    import sys
    from pathlib import Path

    site = os.environ.get("VERL_SITE")
    if not site:
        pytest.skip("verl's set is not installed ($VERL_SITE)")
    sys.path.insert(0, site)
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import verl
    from tools import bench_verl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    for bypass in (False, True):
        overrides = bench_verl.overrides(WORKLOADS["w1"], tmp_path / "model", tmp_path / "p.parquet", tmp_path, 0.5,
                                         bypass)
        with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer/config"), version_base=None):
            config = compose(config_name="ppo_trainer", overrides=overrides)
        OmegaConf.resolve(config)
        assert not need_reference_policy(config) and not need_critic(config)  # no KL, GRPO
        validate_config(config=config, use_reference_policy=False, use_critic=False)
        # the switch verl's trainer reads to skip its old-log-prob pass
        assert bool(config.algorithm.rollout_correction.get("bypass_mode", False)) is bypass
    assert config.actor_rollout_ref.model.custom_chat_template == bench_verl.PLAIN_TEMPLATE
    assert (config.data.train_batch_size, config.actor_rollout_ref.rollout.n, config.trainer.total_training_steps) \
        == (32, 8, 7)


def test_verls_processes_see_no_trl_and_a_runner_that_fails_leaves_a_row(tmp_path):
    """verl 0.9.1 patches TRL's value-head model whenever TRL is importable, and fails with TRL 1.16 (the GPU
    run's first verl row died so): its processes get tools/verl_path first on their path, where TRL cannot be
    found, while other packages of the same folder still import. A framework that fails or runs past the limit
    becomes a row that says so, and the others still run."""
    import os
    import subprocess
    import sys

    from tools import bench_peers

    site = tmp_path / "site"
    for package in ("trl", "other"):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    probe = ("import importlib.util\n"
             "try:\n    importlib.util.find_spec('trl'); print('trl found')\n"
             "except ModuleNotFoundError as e:\n    print('hidden:', e)\n"
             "import other; print('other imports')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(bench_peers.VERL_PATH), str(site)])}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
    assert "hidden: No module named 'trl'" in out and "other imports" in out
    env["PYTHONPATH"] = str(site)  # without it (the TRL row's processes): found
    assert "trl found" in subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                         check=True).stdout

    with pytest.raises(RuntimeError, match=r"slow ran past 1 s and was stopped"):
        bench_peers.run_command("slow", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, 1.0)
    with pytest.raises(RuntimeError, match=r"broken exited 3; its log: .*broken\.log"):
        bench_peers.run_command("broken", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path, 60.0)
    ours = result("vime_ext", WORKLOADS["tiny"], [{"time/total": 2.0}] * 3, gpus=1, wall=9.0)
    rows = table([ours, bench_peers.failure("verl", RuntimeError("verl exited 1; its log: x/verl.log\nmore"))])
    assert "| verl | did not finish: RuntimeError: verl exited 1; its log: x/verl.log |" in rows
    assert rows.splitlines()[2].startswith("| vime_ext | 2.00 |")


def test_a_run_stopped_at_the_limit_keeps_the_steps_it_logged_and_its_row_says_how_far_it_got(tmp_path):
    """verl's first GPU run logged 2 of its 7 steps in the 600 s it was given: the row keeps them, marked, rather
    than saying only that it was stopped. A run stopped before its first step is still a failure."""
    import sys

    from tools import bench_peers

    tiny = WORKLOADS["tiny"]  # 1 warm-up step, 2 timed
    metrics = tmp_path / "steps.jsonl"

    def stopped_after(steps: int) -> dict:
        metrics.unlink(missing_ok=True)
        writer = ("import json, sys, time\n"
                  f"for i in range({steps}):\n"
                  "    open(sys.argv[1], 'a').write(json.dumps({'time/total': 10.0 + i, 'time/rollout': 4.0}) + '\\n')\n"
                  "time.sleep(60)\n")
        run = lambda: bench_peers.run_command("peer", [sys.executable, "-c", writer, str(metrics)], tmp_path, 3.0)  # noqa: E731
        return bench_peers.measure("peer", tiny, run, lambda: bench_peers.jsonl(metrics))

    one_timed = stopped_after(2)
    assert one_timed["stopped_at_limit"] and one_timed["steps_logged"] == 2 and one_timed["timed_steps"] == 1
    assert one_timed["step_s"] == 11.0 and one_timed["wall_s"] >= 3.0
    warm_up_only = stopped_after(1)
    assert warm_up_only["timed_steps"] == 0 and warm_up_only["step_s"] == 10.0
    with pytest.raises(bench_peers.StoppedAtLimit, match="peer ran past 3 s"):
        stopped_after(0)

    ours = result("vime_ext", tiny, [{"time/total": 5.0}] * 3, gpus=1, wall=9.0)
    rows = table([ours, {**one_timed, "framework": "verl"}, {**warm_up_only, "framework": "trl"}]).splitlines()
    assert rows[3].startswith("| verl (stopped at the time limit: 1 of 2 timed steps) | 11.00 |")
    assert rows[4].startswith("| trl (stopped at the time limit: no timed step; warm-up step 1 of 1) | 10.00 |")
    assert rows[2].startswith("| vime_ext | 5.00 |") and not result("x", tiny, [{"time/total": 1.0}] * 3, 1, 1.0)[
        "stopped_at_limit"]


def test_the_generation_path_bench_times_every_path_and_every_reply(tmp_path, tiny_hf_dirs):
    """tools/bench_generate_path.py on the CPU (the transformers engine, the tiny workload): every round of every
    path sends all the workload's requests, gets every reply at its full length, and becomes a row; streamed
    replies pass through vllm-router."""
    from tools import bench_generate_path

    out = tmp_path / "out"
    assert bench_generate_path.main(["--workload", "tiny", "--model-dir", str(tiny_hf_dirs["qwen3"]), "--out",
                                     str(out), "--rounds", "1", "--backend", "hf"]) == 0
    rounds = json.loads((out / "rounds.json").read_text())
    tiny = WORKLOADS["tiny"]
    assert [r["path"] for r in rounds] == ["engine", "router", "router, streamed", "engine"]
    for r in rounds:
        assert r["tokens"] == tiny.prompts * tiny.samples * tiny.response_tokens
        assert 0 < r["first_reply_s"] <= r["last_reply_s"] <= r["wall_s"]
    # --engines 2: two engines behind the router (the requests spread by session id), every reply at full length
    two = tmp_path / "two"
    assert bench_generate_path.main(["--workload", "tiny", "--model-dir", str(tiny_hf_dirs["qwen3"]), "--out",
                                     str(two), "--rounds", "1", "--backend", "hf", "--engines", "2",
                                     "--stream-interval", "0"]) == 0
    rounds = json.loads((two / "rounds.json").read_text())
    assert [r["path"] for r in rounds] == ["router"]
    assert rounds[0]["tokens"] == tiny.prompts * tiny.samples * tiny.response_tokens
    assert len(list((two / "engines").glob("hf_engine_*.log"))) == 2


def test_the_rollout_client_bench_runs_whole_rollouts_against_a_stand_in_engine(tmp_path):
    """tools/bench_rollout_client.py, tiny workload: a stand-in engine in its own process holds each round's
    requests until all have arrived, every rollout gets every sample at full length (the tool checks it), with
    the engine's log-probs and without, replies streamed (here in pieces of 3 tokens) and whole, straight and
    through the router; each round becomes a row."""
    from tools import bench_rollout_client

    out = tmp_path / "rounds.json"
    assert bench_rollout_client.main(["--workload", "tiny", "--rounds", "1", "--stream-interval", "3",
                                      "--out", str(out)]) == 0
    rounds = json.loads(out.read_text())
    assert [(r["path"], r["log_probs"], r["streamed"]) for r in rounds] == [
        (path, log_probs, streamed) for path in ("engine", "router") for log_probs in (True, False)
        for streamed in (True, False)]
    for r in rounds:
        assert 0 < r["first_sample_s"] <= r["last_sample_s"] <= r["wall_s"] and r["client_cpu_s"] > 0
    # The stand-in's replies are vLLM's shape: the client parses them with and without log-probs
    from vime_ext.engines.protocol import StreamedReply, parse_generate_response

    reply = bench_rollout_client.canned_replies(4, 2000, stream_interval=3)[0]
    bodies = [json.loads(body % (b"r", b"[1, 2]")) for body in reply.body]
    whole = parse_generate_response(bodies[1])
    assert whole.log_probs == [e["logprob"] for e in bodies[1]["choices"][0]["logprobs"]["content"]]
    assert len(parse_generate_response(bodies[0], log_probs=False).token_ids) == 4
    for log_probs, pieces in enumerate(reply.pieces):  # two pieces (3 + 1 tokens), the same reply
        streamed = StreamedReply(log_probs=bool(log_probs))
        assert streamed.feed(pieces % {b"id": b"r"}) and pieces.count(b"data:") == 3
        assert streamed.result().token_ids == whole.token_ids
        if log_probs:
            assert streamed.result().log_probs == whole.log_probs


def test_the_engine_profile_summary_reads_a_torch_profiler_trace(tmp_path):
    """bench_generate_path's --profile-steps summary on a real torch-profiler trace made here: three steps of
    vLLM's scope names, the scheduler's before each step (four requests, one call each) and the model runner's
    within it (on the CPU there is no device, so nothing is busy), and the device's busy time as the union of its
    intervals (a kernel inside a copy counted once)."""
    from tools.bench_generate_path import _union_s, profile_summary

    runner = ("gpu_model_runner: forward", "gpu_model_runner: sample")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(4):
            for _ in range(4):
                with torch.profiler.record_function("schedule: allocate_slots"):
                    torch.ones(8, 8) @ torch.ones(8, 8)
            with torch.profiler.record_function("execute_context_0(0)_generation_4(4)"):
                for name in runner:
                    with torch.profiler.record_function(name):
                        torch.ones(64, 64) @ torch.ones(64, 64)
    trace = tmp_path / "worker.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    summary = profile_summary(trace)
    assert summary["steps"] == 3 and summary["window_s"] > 0
    assert summary["device_events"] == 0 and summary["device_busy_s"] == 0.0
    scopes = {*runner, "schedule: allocate_slots"}
    assert set(summary["scope_ms_per_step"]) == scopes == set(summary["scope_calls_per_step"])
    assert summary["scope_calls_per_step"] == {"schedule: allocate_slots": 4.0, **{name: 1.0 for name in runner}}
    assert 0 < summary["scope_ms_per_step"]["gpu_model_runner: forward"] < summary["step_scope_ms"] \
        <= summary["step_ms"]
    assert _union_s([(0, 10), (2, 5), (20, 30), (25, 40)]) == pytest.approx(30e-6)
    with pytest.raises(ValueError, match="at least 2 needed"):
        (tmp_path / "empty.pt.trace.json").write_text('{"traceEvents": []}')
        profile_summary(tmp_path / "empty.pt.trace.json")
