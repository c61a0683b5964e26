"""HF -> torch_dist -> HF through the command-line tools: bit-exact, layout independent, strict about input."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests import dist_workers
from tests.conftest import require_ranks, run_workers
from vime_ext.models.model_config import ParallelConfig

ROOT = Path(__file__).resolve().parents[2]


def run_tool(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / name), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def to_torch_dist(hf_dir: Path, save: Path, *extra: str) -> Path:
    run_tool("convert_hf_to_torch_dist.py", "--hf-checkpoint", str(hf_dir), "--save", str(save), *extra)
    return save


def to_hf(ckpt: Path, out: Path, origin: Path, check: bool = True) -> subprocess.CompletedProcess:
    return run_tool("convert_torch_dist_to_hf.py", "--input-dir", str(ckpt), "--output-dir", str(out),
                    "--origin-hf-dir", str(origin), check=check)


def all_tensors(hf_dir: Path) -> dict:
    tensors = {}
    for file in sorted(hf_dir.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def assert_bit_exact(origin: Path, converted: Path) -> None:
    want, got = all_tensors(origin), all_tensors(converted)
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name


@pytest.fixture(scope="module")
def torch_dist_dirs(tiny_hf_dirs, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("torch_dist")
    return {family: to_torch_dist(hf_dir, root / family) for family, hf_dir in tiny_hf_dirs.items()}


def test_layout_is_megatrons(torch_dist_dirs):
    save = torch_dist_dirs["qwen3"]
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "0"
    assert (save / "iter_0000000" / ".metadata").is_file()
    assert not list(save.glob("*.partial"))


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_round_trip_is_bit_exact(family, tiny_hf_dirs, torch_dist_dirs, tmp_path):
    out = tmp_path / "hf"
    proc = to_hf(torch_dist_dirs[family] / "iter_0000000", out, tiny_hf_dirs[family])
    assert "write HF weights" in proc.stderr  # progress bar
    assert_bit_exact(tiny_hf_dirs[family], out)
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (tiny_hf_dirs[family] / "config.json").read_text())


def test_conversion_under_tensor_parallel_gives_the_same_checkpoint(tiny_hf_dirs, tmp_path):
    require_ranks(2)
    save = to_torch_dist(tiny_hf_dirs["qwen2"], tmp_path / "tp2", "--tensor-model-parallel-size", "2")
    to_hf(save, tmp_path / "hf", tiny_hf_dirs["qwen2"])
    assert_bit_exact(tiny_hf_dirs["qwen2"], tmp_path / "hf")


def test_sharded_output(tiny_hf_dirs, torch_dist_dirs, tmp_path):
    out = tmp_path / "hf"
    run_tool("convert_torch_dist_to_hf.py", "--input-dir", str(torch_dist_dirs["llama"]), "--output-dir",
             str(out), "--origin-hf-dir", str(tiny_hf_dirs["llama"]), "--max-shard-size-mb", "0")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert_bit_exact(tiny_hf_dirs["llama"], out)


def test_checkpoint_saved_at_tp1_loads_at_tp2(tiny_hf_dirs, torch_dist_dirs, tmp_path):
    parallel = ParallelConfig(tensor_model_parallel_size=2)
    results = run_workers(dist_workers.logit_parity, parallel, tmp_path, "parity.json", tiny_hf_dirs, parallel,
                          {f: str(d) for f, d in torch_dist_dirs.items()})
    assert set(results) == set(tiny_hf_dirs)
    assert all(r["max_abs_diff"] <= 1e-4 for r in results.values()), results


def test_missing_hf_tensor_is_named(tiny_hf_dirs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_hf_dirs["qwen3"], broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    proc = run_tool("convert_hf_to_torch_dist.py", "--hf-checkpoint", str(broken), "--save",
                    str(tmp_path / "out"), check=False)
    assert proc.returncode != 0
    assert "model.layers.2.mlp.up_proj.weight" in proc.stderr and "missing 1 tensors" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_interrupted_save_is_refused(tiny_hf_dirs, torch_dist_dirs, tmp_path):
    ckpt = tmp_path / "iter_0000000"
    shutil.copytree(torch_dist_dirs["llama"] / "iter_0000000", ckpt)
    (ckpt / ".metadata").unlink()
    proc = to_hf(ckpt, tmp_path / "hf", tiny_hf_dirs["llama"], check=False)
    assert proc.returncode != 0 and "incomplete torch_dist checkpoint" in proc.stderr and ".metadata" in proc.stderr
    partial = tmp_path / "iter_0000001.partial"
    shutil.copytree(torch_dist_dirs["llama"] / "iter_0000000", partial)
    proc = to_hf(partial, tmp_path / "hf2", tiny_hf_dirs["llama"], check=False)
    assert proc.returncode != 0 and "interrupted save" in proc.stderr


def test_mismatched_origin_is_refused(tiny_hf_dirs, torch_dist_dirs, tmp_path):
    proc = to_hf(torch_dist_dirs["qwen3"], tmp_path / "hf", tiny_hf_dirs["qwen2"], check=False)
    assert proc.returncode != 0
    assert "different model" in proc.stderr and "family: checkpoint 'qwen3' vs origin 'qwen2'" in proc.stderr


def test_origin_of_another_shape_is_refused(tiny_hf_dirs, torch_dist_dirs, tmp_path):
    origin = tmp_path / "origin"
    shutil.copytree(tiny_hf_dirs["qwen3"], origin)
    config = json.loads((origin / "config.json").read_text())
    (origin / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 6}))
    proc = to_hf(torch_dist_dirs["qwen3"], tmp_path / "hf", origin, check=False)
    assert proc.returncode != 0 and "num_layers: checkpoint 4 vs origin 6" in proc.stderr
