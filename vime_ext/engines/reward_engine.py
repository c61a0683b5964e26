"""A fixed model served beside the policy for the reward function (``--rm-hf-checkpoint``): an LLM judge, or a
reader that answers questions from what the policy wrote (MemUpdate's QA score).

Its weights never change: the weight sync, sleep and wake skip it, so a reward computed at rollout 1 and at
rollout 100 comes from the same model (a reward read off the policy itself drifts with it). Its URL reaches
plug-ins as ``args.rm_url``, slime's name for a reward model's address. A watcher thread starts it again at the
same address as soon as it exits; a reward request made while it is down fails after the client's retries, and
a reward function that raises on it fails its sample (``--failed-sample-policy``).
"""

import threading

from vime_ext.engines.servers import EngineConfig, ServerProcess, launch_engine, wait_until_serving

WATCH_EVERY_S = 1.0
START_TIMEOUT_S = 900.0


class RewardModelEngine:
    def __init__(self, config: EngineConfig, wait: bool = True):
        """Starts the engine and, with ``wait``, waits until it serves; without, call ``wait_until_serving``
        (after starting the policy's engines beside it, say)."""
        self.config = config
        self.restarts = 0
        self._lock = threading.Lock()  # a restart and a stop never overlap
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        self.server: ServerProcess = launch_engine(config)
        print(f"starting the reward model's {config.backend} engine ({config.model}); log: {self.server.log_path}",
              flush=True)
        if wait:
            self.wait_until_serving()

    def wait_until_serving(self) -> None:
        """Until it serves (its watcher starts then); a start that fails stops it and raises."""
        try:
            wait_until_serving([self.server], timeout_s=START_TIMEOUT_S)
        except BaseException:
            self.server.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="reward-model-watcher", daemon=True)
        self._watcher.start()

    @property
    def url(self) -> str:
        return self.server.url

    def _watch(self) -> None:
        while not self._stopped.wait(WATCH_EVERY_S):
            with self._lock:  # the launch only: a stop meanwhile stops the new process, and the wait below ends
                if self._stopped.is_set() or self.server.alive():
                    continue
                print(f"the reward model's engine {self.url} exited (code {self.server.process.returncode}); "
                      f"restarting it. Its log: {self.server.log_path}", flush=True)
                self.server.stop()  # the processes it left behind
                try:
                    self.server = launch_engine(self.config)  # the same port: plug-ins keep args.rm_url
                except Exception as err:  # tried again at the next look
                    print(f"the reward model's engine failed to restart: {err}", flush=True)
                    continue
            try:
                wait_until_serving([self.server], timeout_s=START_TIMEOUT_S)
            except Exception as err:  # it died starting, or hung (stopped here): the next look starts it again
                with self._lock:
                    if not self._stopped.is_set():
                        print(f"the reward model's engine failed to restart: {err}", flush=True)
                        self.server.stop()
                continue
            self.restarts += 1

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            self.server.stop()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
