"""The tables analysis tools print and keep: ``OUT.md`` (the table as printed) beside ``OUT.json`` (its figures)."""

import json
from pathlib import Path


def report(text: str, figures, out: str | Path | None) -> None:
    """Print ``text``; with a path stem ``out``, also write it to ``OUT.md`` and ``figures`` to ``OUT.json`` (the
    folder made as needed)."""
    print(text)
    if out is None:
        return
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text(text if text.endswith("\n") else text + "\n")
    Path(f"{out}.json").write_text(json.dumps(figures, indent=1))
