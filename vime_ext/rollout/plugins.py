"""Extension points named by dotted path (``package.module.function``), slime-style."""

import importlib
from typing import Callable


def load_function(path: str, flag: str) -> Callable:
    """Import ``path``; errors name the flag that asked for it."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{flag}={path!r}: expected a dotted path like 'my_pkg.rollout.generate'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{flag}={path!r}: cannot import module {module_name!r}: {err}") from err
    function = getattr(module, attr, None)
    if not callable(function):
        raise ValueError(f"{flag}={path!r}: module {module_name!r} has no callable {attr!r}")
    return function
