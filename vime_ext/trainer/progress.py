"""A trainer rank's progress: a count that moves with every unit of work (a micro-batch, an optimizer step, a
weight tensor pushed, a save begun or ended) and the phase it is in. The driver's watchdog reads it from another
thread while the rank works (``TrainerRanks`` in ``vime_ext/driver/cluster.py``): a count that stops moving, or a
rank that stops answering, is a hang."""

import threading


class Progress:
    def __init__(self):
        self._lock = threading.Lock()
        self._count = 0
        self._phase = "starting"

    def tick(self, phase: str | None = None) -> None:
        with self._lock:
            self._count += 1
            if phase is not None:
                self._phase = phase

    def read(self) -> tuple[int, str]:
        with self._lock:
            return self._count, self._phase
