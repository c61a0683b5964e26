"""First on the path of verl's processes (tools/bench_peers.py's verl row, Ray's workers included): hides TRL.

verl 0.9.1 patches TRL's value-head model whenever TRL is importable, and looks for it where TRL 1.16 (installed
beside it for the TRL row) no longer has it, so every verl worker failed to build its model. The row runs no
value head (GRPO), so TRL is made unimportable for verl alone. Any other ``sitecustomize`` on the path still runs.
"""

import os
import sys


class HideTrl:
    def find_spec(self, name, path=None, target=None):
        if name == "trl" or name.startswith("trl."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden from verl by {__file__})", name=name)
        return None


sys.meta_path.insert(0, HideTrl())

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _other = os.path.join(_entry, "sitecustomize.py")
    if _entry and os.path.abspath(_entry) != _here and os.path.isfile(_other):
        with open(_other) as _file:
            exec(compile(_file.read(), _other, "exec"), {"__name__": "sitecustomize", "__file__": _other})
        break
