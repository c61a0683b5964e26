"""megatron-core's compiled kernels built by ``torch.compile`` on their first call, not at import.

Importing ``megatron.core`` calls ``torch.compile`` at module level: about 40 small fused functions (GEGLU, SwiGLU,
bias-dropout-add, ...) through ``megatron.core.jit.jit_fuser``, and the MoE router's methods directly. The first
such call imports torch's inductor, and each builds a dynamo wrapper: about 4 s on this 2-core machine for every
process that imports megatron (the driver, each trainer rank, each conversion: a torch_dist conversion of a tiny
model took 13.9 s), whether or not it ever calls one of those functions; vime_ext's CPU layers call none.

``install()`` (run when ``vime_ext`` is imported, before any megatron import) hooks the import of
``megatron.core``: while its package runs, ``torch.compile`` applied to a function returns a wrapper that calls
``torch.compile`` on the first call (and ``jit_fuser``, taken from ``torch.compile`` then, stays such a
decorator for kernels imported later). ``torch.compile`` itself compiles on the first call, so what runs and when
it is compiled do not change; the wrapper is built later, and never for a function that is not called.
"""

import functools
import importlib.abc
import importlib.util
import inspect
import sys

TARGET = "megatron.core"


def lazy(compile_fn):
    """A decorator like ``compile_fn`` (``torch.compile``) that builds the compiled function on its first call."""

    def decorate(fn=None, **options):
        if fn is None:  # used as @torch.compile(...) with options
            return lambda f: decorate(f, **options)
        if not inspect.isfunction(fn):  # a module or a bound method: compiled as asked, now
            return compile_fn(fn, **options)
        compiled = None

        @functools.wraps(fn)
        def first_call_compiles(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = compile_fn(fn, **options)
            return compiled(*args, **kwargs)

        return first_call_compiles

    decorate.compiles_lazily = True
    return decorate


class _CompileLazilyDuringExec(importlib.abc.Loader):
    """The package's own loader, run with ``torch.compile`` made lazy until the package has run."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        import torch

        real = torch.compile
        torch.compile = lazy(real)
        try:
            self.loader.exec_module(module)
        finally:
            torch.compile = real


class _Finder(importlib.abc.MetaPathFinder):
    """Hooks the package's first import, then answers nothing. It stays in ``sys.meta_path``: removing itself
    there would shift the list under any other thread's import that was walking it, which then skips a finder and
    fails with ModuleNotFoundError (seen: the rollout manager's thread importing transformers while the trainer
    rank's imported megatron)."""

    def __init__(self):
        self.done = False

    def find_spec(self, name, path, target=None):
        if name != TARGET or self.done:
            return None
        self.done = True  # imports of one name are serialised by the import system's lock for that name
        spec = importlib.util.find_spec(name)  # the real finders locate the file (this one now answers None)
        if spec is not None and spec.loader is not None:
            spec.loader = _CompileLazilyDuringExec(spec.loader)
        return spec


def install() -> None:
    if TARGET not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
