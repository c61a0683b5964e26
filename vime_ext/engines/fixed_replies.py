"""Greedy replies of a fixed model (the run's reward model, whose weights never change), each distinct prompt
asked once per process.

vLLM's batched kernels are not batch-invariant: in bf16 the same greedy prompt can get another reply when it is
batched with other requests. A reward that scores a question before and after the policy's work then counts that
noise as the policy's doing: on an H200, MemUpdate's fixed Qwen2.5-Coder-1.5B reader changed its score on 2 of
64 held-out episodes whose store no edit had touched (mean F1 0.5904 before, 0.5878 after). Asked once, a prompt
has one reply for the rest of the process, so an unchanged prompt scores the same before and after whichever
batch it lands in, and the repeats cost nothing (a GRPO group's samples share their "before" prompts).

Only greedy requests (temperature 0) are kept; sampled ones go to the engine every time. Concurrent requests for
one prompt share one request. A request that fails is not kept, so the next one asks again. Replies are kept per
engine URL (an engine restarted at its address serves the same weights) up to ``max_entries``, oldest dropped
first.

Processes share replies through a file (``--rm-replies-file``, ``ReplyFile``: SQLite, keyed by the model's
checkpoint, the prompt and the sampling settings): the first reply any of them stored is the one every process
uses, so rows and seeds evaluated in separate runs score an unchanged store the same (without it, two H200 runs
of MemUpdate's rows differed by 0.002 in their "before" QA). ``FIXED_REPLIES.ask(args, ...)`` reads the reward
model's address, checkpoint and file from a plug-in's ``args``.
"""

import asyncio
import hashlib
import json
import os
import sqlite3
import threading
from collections import OrderedDict
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from vime_ext.engines.client import RolloutClient
from vime_ext.engines.protocol import GenerateResult, SamplingParams


class FixedModelReplies:
    def __init__(self, max_entries: int = 100_000):
        self.max_entries = max_entries
        self._replies: OrderedDict[tuple, GenerateResult] = OrderedDict()
        self._in_flight: dict[tuple, tuple[asyncio.AbstractEventLoop, asyncio.Task]] = {}
        self.asked = 0  # requests sent to an engine
        self.reused = 0  # requests answered from a kept or in-flight reply

    async def ask(self, args, token_ids: list[int], params: SamplingParams) -> GenerateResult:
        """``generate`` on a plug-in's reward model: ``args.rm_url``, its checkpoint ``args.rm_hf_checkpoint`` and,
        where set, the file the processes share, ``args.rm_replies_file``."""
        checkpoint = getattr(args, "rm_hf_checkpoint", None)
        file = getattr(args, "rm_replies_file", None)
        return await self.generate(args.rm_url, token_ids, params,
                                   shared=(reply_file(file), checkpoint) if file and checkpoint else None)

    async def generate(self, url: str, token_ids: list[int], params: SamplingParams,
                       shared: "tuple[ReplyFile, str] | None" = None) -> GenerateResult:
        """The model's reply at ``url``; greedy ones once per prompt, and with ``shared`` (a file and the model's
        checkpoint) once for every process that uses that file."""
        if params.temperature != 0.0:
            self.asked += 1
            return await _ask(url, token_ids, params)
        digest = hashlib.sha256(np.asarray(token_ids, dtype=np.int64).tobytes()).hexdigest()
        key = (url.rstrip("/"), digest, params)
        if shared is None:
            return await self._kept(key, url, token_ids, params)
        # The file's reply, else this process's, stored unless another process stored one first (then that one:
        # every process uses the first). In a thread: another process's write holds the file for a moment, and
        # this loop has other episodes.
        file, file_key = shared[0], shared[0].key(shared[1], digest, params)
        kept = await asyncio.to_thread(file.get, file_key)
        if kept is not None:
            self.reused += 1
            return kept
        return await asyncio.to_thread(file.put, file_key, await self._kept(key, url, token_ids, params))

    async def _kept(self, key: tuple, url: str, token_ids: list[int], params: SamplingParams) -> GenerateResult:
        """This process's reply under ``key`` (the engine, the prompt's digest, the settings): kept, in flight, or
        asked now."""
        if key in self._replies:
            self._replies.move_to_end(key)
            self.reused += 1
            return _copy(self._replies[key])
        loop = asyncio.get_running_loop()
        entry = self._in_flight.get(key)
        if entry is not None and entry[0] is loop:  # a task belongs to the loop that made it
            self.reused += 1
            task = entry[1]
        else:
            self.asked += 1
            task = loop.create_task(_ask(url, list(token_ids), params))
            self._in_flight[key] = (loop, task)
            task.add_done_callback(lambda done: self._settle(key, done))
        # shielded: a caller that is cancelled leaves the request running for the others that wait on it
        return _copy(await asyncio.shield(task))

    def _settle(self, key: tuple, task: asyncio.Task) -> None:
        if self._in_flight.get(key, (None, None))[1] is task:
            del self._in_flight[key]
        if task.cancelled() or task.exception() is not None:  # reading the exception marks it retrieved
            return
        self._replies[key] = task.result()
        self._replies.move_to_end(key)
        while len(self._replies) > self.max_entries:
            self._replies.popitem(last=False)

    def __len__(self) -> int:
        return len(self._replies)


class ReplyFile:
    """Replies kept in a SQLite file that several processes share (WAL journal: readers do not wait on a
    writer). The first reply stored under a key stays: ``put`` returns whichever is kept."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path, timeout=60, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            # a commit per reply (thousands a GRPO step) without an fsync each: a cache lost to a power cut is
            # asked again
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
        except sqlite3.DatabaseError as err:
            raise ValueError(f"{self.path}: not a reply file of vime_ext.engines.fixed_replies ({err})") from err

    @staticmethod
    def key(checkpoint: str, prompt_digest: str, params: SamplingParams) -> str:
        """The model (its checkpoint's absolute path), the prompt's digest and every sampling setting."""
        return json.dumps([str(Path(checkpoint).resolve()), prompt_digest, asdict(params)], sort_keys=True)

    def get(self, key: str) -> GenerateResult | None:
        with self._lock:
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else GenerateResult(**json.loads(row[0]))

    def put(self, key: str, result: GenerateResult) -> GenerateResult:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO replies (key, reply) VALUES (?, ?)",
                             (key, json.dumps(asdict(result))))
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return GenerateResult(**json.loads(row[0]))

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]


_FILES: dict[tuple[int, str], ReplyFile] = {}


def reply_file(path: str | Path) -> ReplyFile:
    """The process's one connection to the file at ``path`` (by process id: a forked child opens its own, as
    SQLite asks)."""
    key = (os.getpid(), str(Path(path).resolve()))
    if key not in _FILES:
        _FILES[key] = ReplyFile(key[1])
    return _FILES[key]


async def _ask(url: str, token_ids: list[int], params: SamplingParams) -> GenerateResult:
    client = RolloutClient(url)
    try:
        return await client.generate(token_ids, params)
    finally:
        await client.close()


def _copy(result: GenerateResult) -> GenerateResult:
    return replace(result, token_ids=list(result.token_ids), log_probs=list(result.log_probs),
                   extra=dict(result.extra), versions=list(result.versions),
                   prompt_log_probs=list(result.prompt_log_probs))


# The process's replies: reward functions of one rollout process share them.
FIXED_REPLIES = FixedModelReplies()
