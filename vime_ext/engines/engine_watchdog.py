"""A hung engine: its process runs but answers nothing (stopped, a wedged CUDA call, a deadlock in its server).
Requests to it would wait for the client's timeout and be retried on it again, and a weight push to it would
wait for ever. The watchdog asks every serving engine's ``/health`` from a thread of its own; one that has not
answered for ``--engine-hang-timeout`` seconds is named and killed with everything it started, so that the path
for a dead engine (requests fail over, the engine is restarted before the next push or sleep) takes over.

Only engines that have served are watched: one that is starting (loading weights, compiling, capturing CUDA
graphs) answers nothing for minutes, and ``wait_until_serving`` has its own time limit.
"""

import threading
import time
from typing import Callable

import httpx

from vime_ext.engines.servers import ServerProcess


class EngineWatchdog:
    def __init__(self, engines: Callable[[], list[ServerProcess]], hang_timeout_s: float, every_s: float = 2.0):
        """``engines``: the current engines (a restart replaces one; the new one is watched once it serves)."""
        self.engines = engines
        self.hang_timeout_s = hang_timeout_s
        self.every_s = min(every_s, hang_timeout_s / 4)
        self.hangs = 0  # engines killed for hanging
        self._answered: dict[int, float] = {}  # an engine's pid (a restart has a new one) -> when it last answered
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        with httpx.Client(timeout=min(10.0, self.hang_timeout_s / 2)) as http:
            while not self._stopped.wait(self.every_s):
                for engine in list(self.engines()):
                    self.check(engine, http)

    def check(self, engine: ServerProcess, http: httpx.Client) -> None:
        if not engine.served or not engine.alive():
            return
        now = time.monotonic()
        key = engine.process.pid
        last = self._answered.setdefault(key, now)
        try:
            if http.get(engine.url + "/health").status_code == 200:
                self._answered[key] = time.monotonic()
                return
        except httpx.HTTPError:
            pass
        silent = time.monotonic() - last
        if silent >= self.hang_timeout_s and engine.alive() and not self._stopped.is_set():
            print(f"engine {engine.url} (pid {engine.process.pid}) has not answered /health for {silent:.0f} s "
                  f"(--engine-hang-timeout {self.hang_timeout_s:g}); killing it and what it started, to be "
                  f"restarted as a dead engine. Its log: {engine.log_path}", flush=True)
            engine.kill()
            self.hangs += 1
            self._answered.pop(key, None)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=30)
