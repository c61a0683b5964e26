"""megatron-core's torch.compile calls are built on first call (vime_ext/lazy_fusions.py): importing megatron no
longer imports inductor, and a fused kernel still computes what it did, compiled when first called."""

import subprocess
import sys

import torch

from vime_ext.lazy_fusions import lazy

PROBE = """
import sys, torch
import vime_ext, megatron.core
from megatron.core import jit
from megatron.core.fusions.fused_bias_swiglu import swiglu
print("inductor imported:", "torch._inductor.compile_fx" in sys.modules)
print("lazy jit_fuser:", getattr(jit.jit_fuser, "compiles_lazily", False))
print("torch.compile restored:", torch.compile.__module__ == "torch")
x = torch.randn(4, 8)
print("same as eager:", torch.allclose(swiglu(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:]))
print("compiled on the first call:", "torch._inductor.compile_fx" in sys.modules)
"""


def test_megatron_imports_without_building_the_compiler_and_its_kernels_compile_when_called():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["inductor imported: False", "lazy jit_fuser: True",
                                        "torch.compile restored: True", "same as eager: True",
                                        "compiled on the first call: True"], done.stdout


def test_the_wrapper_compiles_once_with_its_options_and_modules_at_once():
    built = []

    def compile_fn(fn, **options):  # records what torch.compile would be asked
        built.append((fn, options))
        return fn

    def double(x):
        return 2 * x

    wrapped = lazy(compile_fn)(double)
    assert built == [] and wrapped.__name__ == "double"
    assert wrapped(3) == 6 and wrapped(4) == 8 and built == [(double, {})]
    with_options = lazy(compile_fn)(fullgraph=True)(double)
    assert with_options(1) == 2 and built[-1] == (double, {"fullgraph": True})
    module = torch.nn.Linear(2, 2)
    assert lazy(compile_fn)(module) is module and built[-1] == (module, {})  # not a function: compiled now
