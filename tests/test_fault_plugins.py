"""The fault suite's own checks: its plug-in finds the run's processes (the router among them), and a row whose
fault never happened is not reported as survived. Found on the CPU suite of 2026-12-04: the router row read
"survived" while the plug-in had not found the router to kill (vllm-router's title blanks its environment)."""

import os
import socket
import subprocess
import sys
import time

import psutil

from tools import fault_plugins
from tools.fault_suite import ROLLOUTS, Fault, summary
from vime_ext.engines.servers import installed_program


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_router_is_found_by_the_run_it_belongs_to(tmp_path, monkeypatch):
    """A real vllm-router started by a process of the run (as the rollout manager starts it) is this run's, found
    by its title, though its own environment reads empty once it has set that title; another run's suite does
    not find it."""
    router = [installed_program("vllm-router"), "--host", "127.0.0.1", "--port", str(free_port()),
              "--worker-urls", "http://127.0.0.1:9"]
    starter = f"import subprocess; subprocess.Popen({router!r}).wait()"
    parent = subprocess.Popen([sys.executable, "-c", starter], env={**os.environ, "VIME_FAULT_DIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while not (children := [p for p in psutil.Process(parent.pid).children() if p.name() == "vllm::router"]):
            assert time.monotonic() < deadline, "the router did not start"
            time.sleep(0.2)
        monkeypatch.setenv("VIME_FAULT_DIR", str(tmp_path))
        assert [p.pid for p in fault_plugins._processes("vllm::router")] == [children[0].pid]
        monkeypatch.setenv("VIME_FAULT_DIR", str(tmp_path / "another_run"))
        assert fault_plugins._processes("vllm::router") == []
    finally:
        for process in psutil.Process(parent.pid).children(recursive=True) + [psutil.Process(parent.pid)]:
            process.kill()
        parent.wait()


def test_a_row_whose_fault_never_happened_says_so(tmp_path):
    """Exit 0 and every rollout trained is "survived" only when the plug-in recorded its fault; the clean run and
    the faults made outside the run (a malformed file, a full disk) record none."""
    log = tmp_path / "run.log"
    log.write_text("TensorBoard logs: ...\n")
    rows = {i: {"train/sequences": 8.0, "train/rollouts_trained_twice": 0.0} for i in range(ROLLOUTS)}

    def outcome(name: str) -> str:
        return summary(Fault(name, ""), 0, 1.0, log, rows)["outcome"]

    assert outcome("router_kill") == "not injected: the run ended without its fault"
    assert outcome("router_kill_colocated") == "not injected: the run ended without its fault"
    assert outcome("clean") == outcome("clean_colocated") == outcome("disk_full") == "survived"
    (tmp_path / "injected").write_text(f"{time.time()} router 123 killed mid-rollout")
    row = summary(Fault("router_kill", ""), 0, 1.0, log, rows)
    assert (row["outcome"], row["injected"], row["trained_twice"]) == ("survived", "router 123 killed mid-rollout", 0)
