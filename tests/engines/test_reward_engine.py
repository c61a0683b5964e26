"""The reward model's watcher when a restart hangs: the restarted engine is alive but never serves (here a real HF
engine process whose interpreter blocks at start-up, in a sitecustomize module on its PYTHONPATH). The watcher
gives up on it after START_TIMEOUT_S, stops it and starts another at the same address, which serves; only that
one counts as a restart."""

import dataclasses
import os
import signal
import time

import httpx

from vime_ext.engines import reward_engine
from vime_ext.engines.servers import EngineConfig
from vime_ext.net import free_port


def test_a_restart_that_hangs_is_stopped_and_tried_again(tiny_hf_dirs, tmp_path, monkeypatch, capfd):
    stuck = tmp_path / "stuck"
    stuck.mkdir()
    (stuck / "sitecustomize.py").write_text("import time\ntime.sleep(3600)\n")
    launches, real_launch = [], reward_engine.launch_engine

    def launch_hanging_the_first_restart(config):
        if len(launches) == 1:
            config = dataclasses.replace(config, env={**config.env, "PYTHONPATH": str(stuck)})
        if len(launches) == 2:
            # The short timeout was for the hung start alone; the real start after it gets the usual time, so that
            # a loaded machine (the suite beside a CPU-heavy job) cannot make it look hung too.
            monkeypatch.setattr(reward_engine, "START_TIMEOUT_S", 900.0)
        launches.append(real_launch(config))
        return launches[-1]

    monkeypatch.setattr(reward_engine, "launch_engine", launch_hanging_the_first_restart)
    config = EngineConfig(str(tiny_hf_dirs["llama"]), backend="hf", port=free_port(), log_dir=str(tmp_path),
                          rl_routes=False)
    rm = reward_engine.RewardModelEngine(config)
    try:
        url = rm.url
        monkeypatch.setattr(reward_engine, "START_TIMEOUT_S", 5.0)  # for the hung start; the launcher resets it
        os.kill(launches[0].process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 960  # the real start's own bound (900 s), not one tuned to an idle machine
        while rm.restarts == 0:
            assert time.monotonic() < deadline, f"no restart; launches: {len(launches)}"
            time.sleep(0.2)
        assert len(launches) == 3 and rm.restarts == 1
        assert launches[1].process.poll() is not None  # the hung one was stopped, not left behind
        assert rm.url == url and rm.server is launches[2]
        assert httpx.get(url + "/health", timeout=10).status_code == 200
        out = capfd.readouterr().out
        assert "failed to restart" in out and "not serving after 5 s" in out
    finally:
        rm.stop()
    assert all(server.process.poll() is not None for server in launches)
