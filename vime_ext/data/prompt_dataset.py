"""Prompt data from JSONL files (``--prompt-data``, ``--input-key``, ``--label-key``, ``--rollout-shuffle``).

Every line is checked when the file is opened, so a malformed line stops the run before any GPU time is spent,
with the file, line number and field in the message. Iteration order is a pure function of (seed, epoch), and
``state()``/``load_state()`` carry the position, so a resumed run draws exactly the batch it would have drawn.
"""

import gzip
import json
import lzma
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DataError(ValueError):
    pass


@dataclass(frozen=True)
class PromptRecord:
    prompt: str | list[dict[str, Any]]
    label: Any
    metadata: dict[str, Any]
    source: str  # "file:line", for messages about this record later

    def as_rollout_input(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "label": self.label, "metadata": {**self.metadata, "source": self.source}}


def _check_prompt(value: Any, where: str, key: str) -> str | list[dict[str, Any]]:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value):
        return value
    raise DataError(f"{where}: field {key!r} must be a non-empty string or a list of "
                    f"{{'role': str, 'content': str}} messages, got {str(value)[:80]!r}")


def json_lines(path: str | Path):
    """``(where, row)`` for every non-blank line of a JSONL file, compressed (``.gz``, or ``.xz`` where the records
    keep episodes that repeat one long store line after line, which gzip's 32 KiB window cannot see) or not
    (``where`` is "file:line"): a line that is not a JSON object raises ``DataError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    with {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            where = f"{path}:{number}"
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))  # with its newline, an unclosed line errs at "column 1"
            except json.JSONDecodeError as err:
                end = ", the end of the line" if err.pos >= len(line.rstrip("\r\n")) else ""
                raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno}{end})") from err
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def jsonl_rows(path: str | Path, input_key: str, label_key: str | None = None):
    """``json_lines`` of prompt data: each row holds ``input_key`` (and ``label_key`` when given), or
    ``DataError`` names the line and the field."""
    for where, row in json_lines(path):
        if input_key not in row:
            raise DataError(f"{where}: missing field {input_key!r} (--input-key); fields: {sorted(row)}")
        if label_key and label_key not in row:
            raise DataError(f"{where}: missing field {label_key!r} (--label-key); fields: {sorted(row)}")
        yield where, row


def row_metadata(row: dict, metadata_key: str | None, where: str) -> dict[str, Any]:
    metadata = row.get(metadata_key) if metadata_key else None
    if metadata is not None and not isinstance(metadata, dict):
        raise DataError(f"{where}: field {metadata_key!r} must be an object")
    return dict(metadata or {})


def read_jsonl(path: str | Path, input_key: str = "prompt", label_key: str | None = "label",
               metadata_key: str | None = "metadata") -> list[PromptRecord]:
    records = [PromptRecord(_check_prompt(row[input_key], where, input_key),
                            row.get(label_key) if label_key else None, row_metadata(row, metadata_key, where), where)
               for where, row in jsonl_rows(path, input_key, label_key)]
    if not records:
        raise DataError(f"{path}: no records")
    return records


class PromptDataset:
    """Batches of prompts, epoch after epoch, optionally shuffled per epoch with a fixed seed."""

    def __init__(self, records: list[PromptRecord], batch_size: int, shuffle: bool = False, seed: int = 0):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.records, self.batch_size, self.shuffle, self.seed = records, batch_size, shuffle, seed
        self.epoch, self.offset = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + epoch).shuffle(order)
        return order

    def next_batch(self) -> list[PromptRecord]:
        batch = []
        while len(batch) < self.batch_size:
            if self.offset == len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            batch.append(self.records[self._order[self.offset]])
            self.offset += 1
        return batch

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "size": len(self.records)}

    def load_state(self, state: dict[str, int]) -> None:
        if state["size"] != len(self.records) or state["seed"] != self.seed:
            raise DataError(f"data state is for {state['size']} records with seed {state['seed']}; this dataset "
                            f"has {len(self.records)} records with seed {self.seed}")
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._order = self._epoch_order(self.epoch)
