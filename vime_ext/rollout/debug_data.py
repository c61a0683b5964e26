"""Rollouts saved to JSON and read back (``--save-debug-rollout-data`` / ``--load-debug-rollout-data``): replay
a rollout into training to debug a reward or a loss without an engine. Floats survive exactly (JSON keeps
Python's shortest round-trip form); metadata values JSON cannot hold are saved as their ``repr``."""

import glob
import json
import re
from dataclasses import asdict
from pathlib import Path

from vime_ext.agent.sample import Sample, Status, Turn

MARKER = "{rollout_id}"


def _template(pattern: str) -> str:
    """``pattern`` with the rollout's id as MARKER: a folder's files are ``rollout_<id>.json``."""
    return pattern if MARKER in pattern else str(Path(pattern) / f"rollout_{MARKER}.json")


def debug_path(pattern: str, rollout_id: int) -> Path:
    if MARKER in pattern:
        return Path(pattern.format(rollout_id=rollout_id))
    return Path(_template(pattern).replace(MARKER, str(rollout_id)))


def save_rollout(pattern: str, rollout_id: int, groups: list[list[Sample]], metrics: dict[str, float]) -> Path:
    path = debug_path(pattern, rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"rollout_id": rollout_id, "metrics": metrics, "groups": [[asdict(s) for s in g] for g in groups]}
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(json.dumps(data, default=repr))
    tmp.replace(path)  # a reader never sees half a file
    return path


def saved_rollout_ids(pattern: str) -> list[int]:
    """The ids of the rollouts saved under ``pattern`` (as ``--save-debug-rollout-data`` takes it), in order."""
    head, tail = _template(pattern).split(MARKER, 1)
    saved = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail))
    return sorted(int(m.group(1)) for path in glob.glob(glob.escape(head) + "*" + glob.escape(tail))
                  if (m := saved.fullmatch(path)))


def sample_from_dict(data: dict, where: str) -> Sample:
    """A Sample from its ``asdict`` form, as saved; ``where`` names it in the error."""
    try:
        turns = [Turn(**t) for t in data.pop("turns")]
        return Sample(**{**data, "status": Status(data["status"]), "turns": turns})
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{where}: not a saved Sample: {err}") from err


def load_rollout(pattern: str, rollout_id: int) -> tuple[list[list[Sample]], dict[str, float]]:
    path = debug_path(pattern, rollout_id)
    if not path.is_file():
        raise FileNotFoundError(f"--load-debug-rollout-data: no saved rollout {rollout_id} at {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err
    groups = [[sample_from_dict(s, f"{path}: group {g}, position {i}") for i, s in enumerate(group)]
              for g, group in enumerate(data["groups"])]
    return groups, dict(data.get("metrics") or {})
