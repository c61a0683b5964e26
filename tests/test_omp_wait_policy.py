"""OpenMP threads that spin after each parallel region take the cores a concurrent process needs (a trainer and
its engines on one host); every process that imports vime_ext makes them sleep instead, unless the user chose."""

import os
import subprocess
import sys

from vime_ext.driver.cluster import _WORKER_ENV

PROBE = ("import os, vime_ext, subprocess, sys; print(os.environ['OMP_WAIT_POLICY']); "
         "print(subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"OMP_WAIT_POLICY\"])'], "
         "capture_output=True, text=True).stdout.strip())")


def policy(env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_importing_vime_ext_makes_openmp_threads_sleep_in_it_and_the_processes_it_starts():
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert policy(env) == ["PASSIVE", "PASSIVE"]


def test_a_value_the_user_sets_wins_and_reaches_ray_workers():
    assert policy({**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}) == ["ACTIVE", "ACTIVE"]
    assert "OMP_WAIT_POLICY" in _WORKER_ENV  # a running Ray head's workers get the driver's value, not their own
