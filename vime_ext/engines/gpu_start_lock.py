"""One vLLM engine at a time starts on a GPU, across processes.

vLLM sizes its KV cache from whole-device free-memory deltas taken around its profile run, so memory that another
process takes or gives back on the same GPU meanwhile is counted as this engine's own: two engines started at
once on one GPU mis-size each other, and one of them may fail with "No available memory for the cache blocks" or
"Error in memory profiling" (vllm-project/vllm issues 55827 and 56830). That is how a MemUpdate evaluation and a
MemAgent evaluation failed on an H200, where a seed's two evaluations and the base model's share a GPU. An engine
therefore holds a file lock per GPU it uses from its launch until it serves or dies, and an engine on a GPU is
stopped under the same lock, so that its memory does not come free inside another's profile run.

Only an engine that sizes its cache that way needs the GPU to itself. One given a fixed cache
(``--kv-cache-memory-bytes``, which skips the sizing) is not spoiled by others' memory moving, so it takes the lock
shared: such engines start side by side (several seeds on one GPU, each with two or three engines to start, would
otherwise queue for minutes), and a stop takes it shared too, since freed memory spoils only a sizing start.
A sizing start (exclusive) waits for the shared holders and they for it; flock gives neither side precedence.
"""

import fcntl
import os
import tempfile
import time
from pathlib import Path

# The GPUs whose lock this process holds, each with how many holds are shared (0: one exclusive hold): an exclusive
# hold beside any other from this process would wait for itself, so that is refused instead.
_HELD: dict[str, int] = {}


def lock_dir() -> Path:
    """VIME_EXT_LOCK_DIR, else a folder of this user's in the temporary directory (another user's lock files
    could not be opened): engines of different users on one GPU are not kept apart."""
    default = Path(tempfile.gettempdir()) / f"vime_ext_locks_{os.getuid()}"
    folder = Path(os.environ.get("VIME_EXT_LOCK_DIR", default))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class GpuStartLock:
    """Locks on ``gpus`` (CUDA_VISIBLE_DEVICES entries), exclusive or ``shared``, taken in sorted order so that
    engines of several GPUs each cannot deadlock; a wait longer than ``report_every_s`` says who holds the lock."""

    def __init__(self, gpus: list[str], what: str = "engine start", report_every_s: float = 15.0,
                 shared: bool = False):
        self.gpus = sorted(set(gpus))
        self.what = what
        self.shared = shared
        self.report_every_s = report_every_s
        self._files: list = []

    @property
    def held(self) -> bool:
        return bool(self._files)

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Take every GPU's lock; False (holding none) if ``timeout_s`` passed first."""
        taken = [g for g in self.gpus if g in _HELD and not (self.shared and _HELD[g] > 0)]
        if taken:
            raise RuntimeError(f"this process already starts an engine on GPU {', '.join(taken)}: start engines "
                               f"that share a GPU one after another (wait_until_serving the first)")
        start = time.time()
        next_report = start + self.report_every_s
        for gpu in self.gpus:
            handle = open(lock_dir() / f"gpu_{gpu.replace('/', '_')}.lock", "a+")  # noqa: SIM115 (held until release)
            while True:
                try:
                    fcntl.flock(handle, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    now = time.time()
                    if timeout_s is not None and now - start > timeout_s:
                        handle.close()
                        self.release()
                        return False
                    if now >= next_report:
                        next_report += self.report_every_s
                        handle.seek(0)
                        holder = handle.read().strip() or "another process"
                        print(f"{self.what} on GPU {gpu} waits ({now - start:.0f} s) for {holder}", flush=True)
                    time.sleep(0.2)
            handle.seek(0)
            handle.truncate()  # shared holders: the last one to come is named
            handle.write(f"pid {os.getpid()} ({self.what})")
            handle.flush()
            self._files.append(handle)
            _HELD[gpu] = _HELD.get(gpu, 0) + 1 if self.shared else 0
        return True

    def release(self) -> None:
        for gpu, handle in zip(self.gpus, self._files):
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
            if _HELD.get(gpu, 0) > 1:
                _HELD[gpu] -= 1
            else:
                _HELD.pop(gpu, None)
        self._files = []


def holds(gpus: list[str]) -> bool:
    """Whether this process holds the lock of every GPU in ``gpus``."""
    return set(gpus) <= _HELD.keys()
