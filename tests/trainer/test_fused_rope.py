"""The fused RoPE kernel against megatron-core's unfused RoPE: values and gradients, full and partial rotary
dims, odd sizes, and packed (THD) sequences whose positions restart at each sequence. On the CPU the Triton kernel runs in Triton's interpreter (a subprocess with
TRITON_INTERPRET=1, which must be set before Triton compiles anything); on CUDA it runs compiled, also in bf16."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def compare(device: str, dtype: torch.dtype) -> dict:
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from vime_ext.trainer import cpu_shim
    from vime_ext.trainer.fused_rope import fused_rope, fused_rope_thd

    cpu_shim.install()
    g = torch.Generator().manual_seed(0)
    results = {}
    for name, percent, head_dim, seq in (("full", 1.0, 16, 5), ("partial", 0.5, 16, 7), ("head96", 1.0, 96, 3)):
        freqs = RotaryEmbedding(kv_channels=head_dim, rotary_percent=percent, rotary_base=10000,
                                use_cpu_initialization=True)(seq + 2).to(device)  # longer than seq, as may be
        x = torch.randn(seq, 2, 3, head_dim, generator=g).to(device, dtype).requires_grad_(True)
        grad = torch.randn(seq, 2, 3, head_dim, generator=g).to(device, dtype)
        # Reference in fp32 (megatron's own code), so bf16 error is measured against exact values.
        x32 = x.detach().float().requires_grad_(True)
        ref = _apply_rotary_pos_emb_bshd(x32, freqs[:seq])
        (ref_grad,) = torch.autograd.grad(ref, x32, grad.float())
        out = fused_rope(x, freqs)
        (out_grad,) = torch.autograd.grad(out, x, grad)
        results[name] = {"value": (out.float() - ref).abs().max().item(),
                         "grad": (out_grad.float() - ref_grad).abs().max().item(),
                         "scale": ref.abs().max().item(), "dtype_ok": out.dtype == dtype}
    # Packed: sequences of 3, 4 and 1 tokens end to end; megatron's own THD code applies bshd RoPE to each
    # sequence from position 0, which is the reference here.
    lengths, head_dim = [3, 4, 1], 16
    freqs = RotaryEmbedding(kv_channels=head_dim, rotary_percent=1.0, rotary_base=10000,
                            use_cpu_initialization=True)(max(lengths)).to(device)
    cu_seqlens = torch.tensor([0, 3, 7, 8], dtype=torch.int32, device=device)
    x = torch.randn(sum(lengths), 3, head_dim, generator=g).to(device, dtype).requires_grad_(True)
    grad = torch.randn(sum(lengths), 3, head_dim, generator=g).to(device, dtype)
    x32 = x.detach().float().requires_grad_(True)
    ref = torch.cat([_apply_rotary_pos_emb_bshd(part.unsqueeze(1), freqs[:len(part)]).squeeze(1)
                     for part in x32.split(lengths)])
    (ref_grad,) = torch.autograd.grad(ref, x32, grad.float())
    out = fused_rope_thd(x, cu_seqlens, freqs)
    (out_grad,) = torch.autograd.grad(out, x, grad)
    results["thd"] = {"value": (out.float() - ref).abs().max().item(),
                      "grad": (out_grad.float() - ref_grad).abs().max().item(),
                      "scale": ref.abs().max().item(), "dtype_ok": out.dtype == dtype}
    return results


def test_fused_rope_matches_megatron_in_the_interpreter():
    code = ("import json; from tests.trainer.test_fused_rope import compare; import torch; "
            "print('RESULT', json.dumps(compare('cpu', torch.float32)))")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.split("RESULT", 1)[1])
    for name, r in results.items():
        assert r["value"] < 1e-5 and r["grad"] < 1e-5 and r["dtype_ok"], (name, r)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rope_matches_megatron_on_cuda(dtype):
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bf16: one rounding of values of size ~3
    for name, r in compare("cuda", dtype).items():
        assert r["value"] < tolerance * max(r["scale"], 1.0) and r["grad"] < tolerance * max(r["scale"], 1.0) \
            and r["dtype_ok"], (name, r)
