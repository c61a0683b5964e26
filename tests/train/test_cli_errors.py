"""A user's mistake on the command line is one clear message and a non-zero exit, never a traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv, first_line", [
    (["train.py", "--frobnicate", "3"], "train.py: error: unrecognized arguments: --frobnicate"),
    (["train.py", "--hf-checkpoint", "/nonexistent", "--prompt-data", "x.jsonl", "--lr=oops"],
     "train.py: error: argument --lr: invalid float value: 'oops'"),
    (["tools/convert_hf_to_torch_dist.py", "--hf-checkpoint", "/nonexistent", "--save", "/tmp/never"],
     "convert_hf_to_torch_dist.py: --hf-checkpoint /nonexistent: no config.json there"),
    (["tools/convert_torch_dist_to_hf.py", "--input-dir", "/nonexistent", "--output-dir", "/tmp/never",
      "--origin-hf-dir", "/nonexistent"], "convert_torch_dist_to_hf.py: --origin-hf-dir /nonexistent: no config"),
    (["tools/convert_hf_to_torch_dist.py", "--bogus"], "convert_hf_to_torch_dist.py: error: unrecognized"),
])
def test_bad_input_is_one_message_without_traceback(argv, first_line):
    done = run(*argv)
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert done.returncode == 2 and lines and lines[0].startswith(first_line), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(lines) <= 2


@pytest.mark.parametrize("case, first_line", [
    ("data", "train.py: {dir}/bad.jsonl:2: not valid JSON"),
    ("config", "train.py: --custom-config-path {dir}/bad.yaml: cannot parse"),
    ("contradiction", "train.py: invalid flags:"),
    ("ref_load", "train.py: --ref-load {dir}: incomplete torch_dist checkpoint"),
])
def test_bad_data_and_config_are_one_message(case, first_line, smollm2_dir, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "label": "b"}\n{"prompt": \n')
    (tmp_path / "good.jsonl").write_text('{"prompt": "a", "label": "b"}\n')
    (tmp_path / "bad.yaml").write_text("key: [unclosed\n")
    argv = ["train.py", "--hf-checkpoint", str(smollm2_dir), "--prompt-data", str(tmp_path / "good.jsonl")]
    argv += {"data": ["--prompt-data", str(tmp_path / "bad.jsonl")],
             "config": ["--custom-config-path", str(tmp_path / "bad.yaml")],
             "contradiction": ["--kl-loss-coef", "0.1"],
             "ref_load": ["--ref-load", str(tmp_path)]}[case]
    done = run(*argv)
    lines = [line for line in done.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(first_line.format(dir=tmp_path)), done.stderr[-2000:]


def test_a_missing_checkpoint_directory_names_the_flag(smollm2_dir):
    done = run("tools/convert_torch_dist_to_hf.py", "--input-dir", "/nonexistent", "--output-dir", "/tmp/never",
               "--origin-hf-dir", str(smollm2_dir))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "convert_torch_dist_to_hf.py: --input-dir /nonexistent: " in done.stderr


def test_save_keep_last_keeps_the_newest_and_the_resumed_one(tmp_path):
    from vime_ext.trainer.checkpoint import TRACKER_FILE, iteration_dir, prune_checkpoints

    for i in (1, 2, 3, 4, 5):
        iteration_dir(tmp_path, i).mkdir()
    (tmp_path / "iter_0000006.partial").mkdir()  # an interrupted save: neither counted nor touched
    (tmp_path / TRACKER_FILE).write_text("5")
    deleted = prune_checkpoints(tmp_path, keep_last=2, protect=iteration_dir(tmp_path, 1))
    assert sorted(p.name for p in deleted) == ["iter_0000002", "iter_0000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000001", "iter_0000004", "iter_0000005",
                                                          "iter_0000006.partial", TRACKER_FILE]
    assert prune_checkpoints(tmp_path, keep_last=1) == [iteration_dir(tmp_path, 1), iteration_dir(tmp_path, 4)]
    assert [p.name for p in tmp_path.glob("iter_???????")] == ["iter_0000005"]  # the tracker's, kept
    with pytest.raises(ValueError, match="at least 1"):
        prune_checkpoints(tmp_path, keep_last=0)


def test_every_flag_has_help_text():
    """train.py's flags and both conversion tools' (each tool's parser in its own process: importing a
    conversion tool hides CUDA from the process that imports it)."""
    script = ("import importlib, sys; sys.path.insert(0, 'tools'); "
              "from vime_ext.arguments import build_parser as train; "
              "parsers = [train(), importlib.import_module('convert_hf_to_torch_dist').build_parser(), "
              "importlib.import_module('convert_torch_dist_to_hf').build_parser()]; "
              "print([a.option_strings[0] for p in parsers for a in p._actions if a.option_strings and not a.help]); "
              "print(sum(len(p._actions) for p in parsers))")
    done = run("-c", script)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines[-2] == "[]", done.stdout + done.stderr[-2000:]
    assert int(lines[-1]) > 100
    described = run("train.py", "--help").stdout
    assert "GRPO, or PPO with a critic" in described


def test_known_harmless_warnings_are_silenced_and_others_are_not():
    done = run("-W", "default", "-c", "import logging, warnings, vime_ext; "
               "warnings.warn('Transformer Engine and Apex are not installed. Falling back', UserWarning); "
               "warnings.warn('full scope is deprecated. Use empty cuda_graph_modules', UserWarning); "
               "logging.getLogger('megatron.core.dist_checkpointing.strategies.torch').warning("
               "\"MCore's async save is deprecated and will be removed\"); "
               "warnings.warn('Please use DTensor instead and we are deprecating ShardedTensor.', FutureWarning); "
               "warnings.warn('something new', UserWarning)")
    assert done.returncode == 0 and "something new" in done.stderr
    assert "Transformer Engine" not in done.stderr and "full scope" not in done.stderr
    assert "async save" not in done.stderr and "DTensor" not in done.stderr
