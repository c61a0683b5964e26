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


# Another thread's import walks sys.meta_path while this one imports megatron; played here in one thread: the
# search for a missing module reaches a finder that imports megatron.core, then must go on to the next finder.
WALK = """
import sys
import vime_ext
asked = []

class ImportsMegatron:
    def find_spec(self, name, path, target=None):
        if name == "a_module_nobody_has":
            import megatron.core
        return None

class Records:
    def find_spec(self, name, path, target=None):
        asked.append(name)
        return None

hook = next(i for i, f in enumerate(sys.meta_path) if type(f).__name__ == "_Finder")
sys.meta_path[hook + 1:hook + 1] = [ImportsMegatron(), Records()]
try:
    import a_module_nobody_has
except ModuleNotFoundError:
    pass
print("megatron imported:", "megatron.core" in sys.modules)
print("the next finder asked:", "a_module_nobody_has" in asked)
print("the hook kept in its place:", type(sys.meta_path[hook]).__name__ == "_Finder")
"""


def test_the_import_hook_leaves_the_finder_list_alone_for_imports_walking_it():
    done = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["megatron imported: True", "the next finder asked: True",
                                        "the hook kept in its place: True"], done.stdout
