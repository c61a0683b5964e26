"""Plug-ins named by dotted path (``package.module.function``, slime-style), the ``args`` they receive, and
their own settings (``--custom-config-path``).

Plug-in signatures (slime/vime-compatible; ``async def`` or plain ``def``, both are awaited as needed):

    generate(args, sample, sampling_params, evaluation=False) -> Sample | list[Sample]
    rm(args, sample) -> float | dict                       (--custom-rm-path)
    rm(args, samples) -> list[float | dict]                 (--custom-rm-path with --group-rm: one group)
    rollout_function(args, rollout_id, data_source, evaluation=False) -> list[list[Sample]] | RolloutOutput
    convert_samples_to_train_data(args, samples) -> list[TrainSequence]
    dynamic_sampling_filter(args, group) -> bool            (keep the group?)

``args`` is a ``PluginArgs``: every flag of ``train.py`` as an attribute under its slime name
(``args.rollout_max_response_len``, ``args.n_samples_per_prompt``, ...), every key of ``--custom-config-path``,
and, in the process that runs rollouts, ``args.tokenizer`` (the served model's tokenizer), ``args.rollout_client``
(a ``RolloutClient`` for the router, valid while a rollout runs) and ``args.weight_version``. In an evaluation,
``args.save_progress(sample, state)`` keeps a long item's state so that a rerun resumes it
(``sample.metadata["resume"]``; ``vime_ext.item_progress``); it is None in training.
"""

import asyncio
import importlib
import inspect
import json
import os
import re
import sys
import threading
import types
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Callable


class PluginArgs(types.SimpleNamespace):
    """Attribute access to every flag and custom setting; a missing name says which names exist."""

    def __getattr__(self, name: str) -> Any:  # only called when the attribute is missing
        if name.startswith("__"):
            raise AttributeError(name)
        known = sorted(k for k in vars(self) if not k.startswith("_"))
        raise AttributeError(f"args has no setting {name!r}: not a train.py flag and not a key of "
                             f"--custom-config-path; settings start with {known[:12]} ...")

    def __getstate__(self) -> dict:  # the tokenizer and the client stay in their process
        return {k: v for k, v in vars(self).items() if k not in _PROCESS_LOCAL}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)


_PROCESS_LOCAL = ("tokenizer", "rollout_client", "loop", "save_progress")


def plugin_args(sections: list[Any], custom: dict[str, Any] | None = None) -> PluginArgs:
    """One flat namespace from config dataclasses (their field names are the flags' names) and custom settings."""
    values: dict[str, Any] = {}
    for section in sections:
        if is_dataclass(section):
            values.update({f.name: getattr(section, f.name) for f in fields(section)})
    values.update(custom or {})
    return PluginArgs(tokenizer=None, rollout_client=None, loop=None, weight_version=None, save_progress=None,
                      **values)


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any, where: str) -> Any:
    """``${NAME}`` and ``${NAME:-default}`` in string values come from the environment (launch scripts fill
    plug-in settings this way); a whole-string reference that looks like a number becomes that number, and one
    that reads ``null`` becomes None (so a variable can switch an optional setting off)."""
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def lookup(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is None:
            raise ValueError(f"{where}: environment variable {name} is not set (write ${{{name}:-default}} to "
                             "give a default)")
        return default

    expanded = _ENV.sub(lookup, value)
    if _ENV.fullmatch(value.strip()):
        if expanded.strip() == "null":
            return None
        for kind in (int, float):
            try:
                return kind(expanded)
            except ValueError:
                pass
    return expanded


def load_custom_config(path: str, framework_names: set[str]) -> dict[str, Any]:
    """The settings in a YAML or JSON file (a mapping); keys that are framework flags are refused."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--custom-config-path {path}: no such file")
    text = file.read_text(encoding="utf-8")
    try:
        if file.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as err:  # the parsers' own errors carry line and column
        raise ValueError(f"--custom-config-path {path}: cannot parse: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ValueError(f"--custom-config-path {path}: expected a mapping of setting names to values, got "
                         f"{type(data).__name__}")
    clashes = sorted(k for k in data if k.replace("-", "_") in framework_names)
    if clashes:
        raise ValueError("; ".join(f"--custom-config-path {path}: key {k!r} is the framework flag "
                                   f"--{k.replace('_', '-')}; give it on the command line or rename the key"
                                   for k in clashes))
    bad = [k for k in data if not k.isidentifier()]
    if bad:
        raise ValueError(f"--custom-config-path {path}: keys {bad} are not Python names (args.<key> must work)")
    return {k: _expand_env(v, f"--custom-config-path {path}, key {k}") for k, v in data.items()}


def load_function(path: str, flag: str) -> Callable:
    """Import ``path``; errors name the flag that asked for it and where Python looked."""
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{flag}={path!r}: expected a dotted path like 'my_pkg.rollout.generate'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{flag}={path!r}: cannot import module {module_name!r}: {err}. Python looked in "
                         f"{[p or '.' for p in sys.path]} (the launch directory is put on every Ray worker's "
                         "path; elsewhere set PYTHONPATH)") from err
    function = getattr(module, attr, None)
    if not callable(function):
        raise ValueError(f"{flag}={path!r}: module {module_name!r} has no callable {attr!r}")
    return function


# Every plug-in flag, with how the framework calls it: positional arguments, then keywords.
PLUGIN_CALLS = {
    "custom_generate_function_path": ("generate(args, sample, sampling_params, evaluation=False)", 3,
                                      ("evaluation",)),
    "custom_rm_path": ("rm(args, sample) (with --group-rm: rm(args, samples))", 2, ()),
    "rollout_function_path": ("rollout(args, rollout_id, data_source, evaluation=False)", 3, ("evaluation",)),
    "custom_convert_samples_to_train_data_path": ("convert(args, samples)", 2, ()),
    "dynamic_sampling_filter_path": ("filter(args, group)", 2, ()),
}


def check_plugin(path: str, name: str) -> None:
    """Import the plug-in at ``path`` (given as flag ``name``) and check that the framework's call binds to its
    signature, before any process or model starts. The launch directory is on the path, as on every Ray worker."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    flag = f"--{name.replace('_', '-')}"
    function = load_function(path, flag)
    call, positional, keywords = PLUGIN_CALLS[name]
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C function without a signature: nothing to check
        return
    try:
        signature.bind(*[None] * positional, **{k: None for k in keywords})
    except TypeError as err:
        raise ValueError(f"{flag}={path!r}: the framework calls it as {call}, which its signature {signature} "
                         f"does not accept ({err})") from None


def _in_daemon_thread(function: Callable, args: tuple, kwargs: dict) -> asyncio.Future:
    """``function(*args, **kwargs)`` on a thread of its own, its outcome settling the returned future on this
    loop. A daemon thread: one that hangs past its sample's timeout never keeps a finished run alive."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run() -> None:
        try:
            outcome = (function(*args, **kwargs), None)
        except BaseException as err:  # noqa: BLE001 (handed to the awaiting coroutine)
            outcome = (None, err)
        try:
            loop.call_soon_threadsafe(_settle, future, *outcome)
        except RuntimeError:  # the rollout's loop is gone (it finished without this call)
            pass

    threading.Thread(target=run, name="vime-plugin", daemon=True).start()
    return future


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if not future.cancelled():
        future.set_exception(error) if error is not None else future.set_result(result)


async def call_plugin(function: Callable, *args, **kwargs) -> Any:
    """Call a plug-in that may be ``async def`` or plain ``def``. A plain one runs on a thread of its own, so that
    the event loop goes on (other samples, and ``--rollout-sample-timeout``, which a plain function that hangs
    could not otherwise be held to) and so that it may wait on ``asyncio.run_coroutine_threadsafe(...,
    args.loop)``; several run at once, as async ones interleave, so state they share needs a lock."""
    if inspect.iscoroutinefunction(function):
        return await function(*args, **kwargs)
    result = await _in_daemon_thread(function, args, kwargs)
    if hasattr(result, "__await__"):  # a plain function that returned a coroutine
        result = await result
    return result
