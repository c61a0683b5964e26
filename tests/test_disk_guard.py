"""The suite refuses to start on a disk without room for what it writes (tests/conftest.py), with one message,
instead of failing hundreds of tests midway with errors that do not say why."""

import os
import subprocess
import sys
from pathlib import Path


def test_the_suite_refuses_to_start_without_room_on_the_disk(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "VIME_EXT_TESTS_MIN_FREE_GB": "1e12"}  # more than any disk has
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "bt"), "tests/test_free_port.py"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "GB free on the disk of" in done.stdout + done.stderr and "passed" not in done.stdout
