"""An engine that dies while a weight push opens (CI caught the watchdog killing a hung engine while /pause waited
on it: the connection reset reached the driver before the process could be reaped, and the run failed): the
rollout manager restarts it and opens the update on the new engine, which then takes the push's version."""

import os
import signal

from vime_ext.arguments import parse_train_args
from vime_ext.data.synthetic import write_jsonl
from vime_ext.driver.rollout_manager import RolloutManager


def test_a_push_opening_on_a_hung_engine_restarts_it_and_goes_on(tiny_hf_dirs, tmp_path):
    data = write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 2)
    config = parse_train_args([
        "--hf-checkpoint", str(tiny_hf_dirs["llama"]), "--prompt-data", str(data), "--engine-backend", "hf",
        "--rollout-num-gpus", "2", "--engine-hang-timeout", "4", "--rollout-batch-size", "1",
        "--n-samples-per-prompt", "2", "--global-batch-size", "2", "--custom-rm-path",
        "tests.train.toy_rewards.even_token_share"])
    manager = RolloutManager(config, log_dir=str(tmp_path / "engines"))
    try:
        hung = manager.engines[0]
        os.kill(hung.process.pid, signal.SIGSTOP)  # alive, answering nothing: /pause waits until the watchdog
        manager.begin_weight_update()
        assert manager.watchdog.hangs == 1 and manager.restarts == 1
        assert manager.engines[0].url == hung.url and manager.engines[0].process.pid != hung.process.pid
        manager.finish_weight_update(1)
        assert manager.sync.versions() == {url: "1" for url in manager.engine_urls()}
    finally:
        manager.shutdown()
