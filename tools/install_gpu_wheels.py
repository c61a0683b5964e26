"""Install the wheels in a folder that the running Python lacks (offline GPU machines with torch and
transformers already present): a distribution already installed is left alone, so nothing it pins is replaced.

    python3 tools/install_gpu_wheels.py .gpu_wheels
"""

import subprocess
import sys
from importlib import metadata
from pathlib import Path


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def main(folder: str) -> None:
    installed = {canonical(d.metadata["Name"]) for d in metadata.distributions()}
    missing = [str(w) for w in sorted(Path(folder).glob("*.whl"))
               if canonical(w.name.split("-")[0]) not in installed]
    print(f"installing {len(missing)} of {len(list(Path(folder).glob('*.whl')))} wheels: "
          + ", ".join(Path(m).name.split("-")[0] for m in missing))
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *missing],
                       check=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".gpu_wheels")
