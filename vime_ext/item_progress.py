"""Where each item of a long evaluation has got to, kept on disk so that a killed evaluation resumes an item where
it stopped instead of from its start (a million-token MemAgent item reads 180 chunks, tens of minutes).

The evaluation loop (``vime_ext.evaluate.evaluate_items``) opens one ``ItemProgress`` beside its results file and
offers it to the generate plug-in as ``args.save_progress(sample, state)``; the plug-in saves a JSON-able state
after each expensive step, and on the next run finds the last state it saved in ``sample.metadata["resume"]``
(None when there is none). A plug-in that never saves is unaffected. Training sets no ``save_progress``.

The file holds one line ``{"_id": ..., "state": ...}`` per save and the last line of an id wins; it is compacted
(one line per id still in flight) when it grows past a few lines per id, when it is opened and when it is closed,
so that it stays small enough to carry from one machine to the next. Rows of finished items supersede it.
"""

import json
import os
from pathlib import Path

COMPACT_FACTOR = 4  # lines per id the file may reach before it is rewritten


class ItemProgress:
    def __init__(self, path: Path, finished: set[str]):
        self.path = path
        self.finished = set(finished)
        self.states: dict[str, object] = {}
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # a line torn by a kill
                    continue
                if isinstance(entry, dict) and "_id" in entry and "state" in entry:
                    self.states[str(entry["_id"])] = entry["state"]
        self.lines = 0
        self.compact()

    def state(self, item_id: str):
        """The last state saved for ``item_id`` by an earlier run or attempt (None: start from the beginning)."""
        return None if item_id in self.finished else self.states.get(item_id)

    def save(self, item_id: str, state) -> None:
        self.states[item_id] = state
        with self.path.open("a", encoding="utf-8") as sink:
            sink.write(json.dumps({"_id": item_id, "state": state}) + "\n")
        self.lines += 1
        if self.lines > COMPACT_FACTOR * max(len(self.states), 1):
            self.compact()

    def finish(self, item_id: str) -> None:
        """``item_id``'s row is written: its state is no longer needed."""
        self.finished.add(item_id)
        self.states.pop(item_id, None)

    def compact(self) -> None:
        """Rewrite the file with one line per unfinished item (atomically: a kill leaves the old or the new);
        no file when none is left."""
        live = {k: v for k, v in self.states.items() if k not in self.finished}
        self.states = live
        self.lines = len(live)
        if not live:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.path.with_name(self.path.name + ".tmp")
        scratch.write_text("".join(json.dumps({"_id": k, "state": v}) + "\n" for k, v in live.items()),
                           encoding="utf-8")
        os.replace(scratch, self.path)
