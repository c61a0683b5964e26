"""Weights pushed in the middle of a rollout (``--partial-rollout``): the gate between the rollout's requests and
the weight push.

The push closes the gate, pauses the engines with in-flight requests aborted (each answers with the tokens it
had, ``finish_reason`` "abort"), loads the new weights, and reopens the gate with the new version. The client
(``RolloutClient.generate``) keeps an aborted request's tokens and log-probs, waits at the gate, and asks again
for the rest: the prompt followed by those tokens, the remaining token budget. The engine recomputes the KV cache
of that prefix under the new weights; the tokens already sampled are kept as they were, each tagged with the
version that sampled it.

A request sent while the gate was open reaches the engine a moment later; if the pause came in between, the
engine holds it and serves it after the push, under the new weights, while it is tagged with the older version.
So a tag can overstate a token's staleness by one version, never understate it: the bound stays safe.

The gate is shared between threads (the driver's push, the rollout's event loop), so it is a threading object;
the client polls it from its event loop.
"""

import asyncio
import threading


class GenerationGate:
    def __init__(self, version: int = 0):
        self._open = threading.Event()
        self._open.set()
        self.version = version
        self.interruptions = 0  # requests aborted by a push and asked again (read into rollout metrics)

    def close(self) -> None:
        """Before the engines pause: no new request leaves the client until ``open``."""
        self._open.clear()

    def open(self, version: int) -> None:
        """After the push: ``version`` now samples every token."""
        self.version = version
        self._open.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self, poll_s: float = 0.01) -> int:
        """Wait (without blocking the event loop) until the gate is open; the version it opened with."""
        while not self._open.is_set():
            await asyncio.sleep(poll_s)
        return self.version
