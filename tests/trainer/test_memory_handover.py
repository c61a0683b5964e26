"""Colocated mode's memory hand-over (``vime_ext/trainer/memory_handover.py``) leaves training unchanged: a
trainer that releases everything (policy weights last), restores it and trains on takes exactly the step of one
that never let go. PPO with a KL reference, so the policy, its optimizer, the reference model and the critic all
go through it. On the CPU the storages are freed and refilled in host memory; on CUDA (run on a GPU machine) the
same code frees device memory, with megatron-core's DDP buffers and optimizer."""

import gc
import json
import subprocess
import sys
import weakref

import pytest
import torch

from tests import dist_workers
from tests.train.test_optimizer_resume import DISTRIBUTED, OFFLOAD, OFFLOAD_NEEDS_CUDA, trainer_flags
from vime_ext.trainer.launch import run_on_ranks
from vime_ext.trainer import memory_handover
from vime_ext.trainer.memory_handover import MemoryHandover, describe_pinned_segments

PPO = ["--advantage-estimator", "ppo", "--kl-coef", "0.05", "--critic-lr", "1e-3"]


@pytest.fixture(autouse=True)
def unfrozen(monkeypatch):
    """A release freezes the process's start-up objects (``collect_garbage``); in the test process that would be
    whatever the earlier tests left alive, so each test here starts and ends unfrozen."""
    gc.unfreeze()
    monkeypatch.setattr(memory_handover, "_frozen", False)
    yield
    gc.unfreeze()


@pytest.mark.parametrize("cuda_flags,flags", [
    pytest.param(DISTRIBUTED, [], id="distributed"),
    pytest.param(OFFLOAD, [], id="offload", marks=OFFLOAD_NEEDS_CUDA),
    pytest.param(DISTRIBUTED, ["--colocate", "--no-offload-optimizer-state"], id="optimizer-state-kept")])
def test_training_after_a_handover_equals_training_without(cuda_flags, flags, tiny_hf_dirs, tmp_path):
    flags = trainer_flags(tiny_hf_dirs, tmp_path, 1, cuda_flags) + PPO + flags
    for handover in (False, True):
        run_on_ranks(dist_workers.handover_step, 1, str(tmp_path), flags, handover, isolate=True)
    plain, moved = (json.loads((tmp_path / f"{tag}.json").read_text()) for tag in ("plain", "handover"))
    assert moved["weights_kept"] and moved["others_released"] and moved["weights_released"]
    assert moved["state_gb"] > 0
    if "--no-offload-optimizer-state" in flags:  # the state never leaves: neither copied nor freed
        assert moved["state_in_place_throughout"] and moved["released_gb"] == pytest.approx(moved["restored_gb"])
    else:  # the optimizer's state is not brought back with the rest, only by the next step
        assert moved["state_away_after_restore"] and moved["state_back_after_step"]
        assert moved["released_gb"] == pytest.approx(moved["restored_gb"] + moved["state_gb"])
    assert moved["restored_gb"] > 0 and moved["start_up_frozen"]
    # The reference model is copied out once; later rounds copy only what training changes.
    assert 0 < moved["second_round_copied_gb"] < moved["first_round_copied_gb"]
    # The state's trip back is timed into the step's figures (train/state_restore_s), only when it was away; the
    # actor's step brings the critic's back with its own (one hand-over), so the critic's step finds it in place
    away = "--no-offload-optimizer-state" not in flags
    assert (moved["steps"][0]["state_restore_s"] > 0) == away and moved["steps"][0]["critic_state_restore_s"] == 0
    assert all(step["state_restore_s"] == step["critic_state_restore_s"] == 0 for step in plain["steps"])
    for steps in (plain["steps"], moved["steps"]):  # the rest are the same figures
        for step in steps:
            del step["state_restore_s"], step["critic_state_restore_s"]
    before, after = (torch.load(tmp_path / f"{tag}_weights.pt") for tag in ("plain", "handover"))
    assert sorted(before) == sorted(after) and plain["steps"][0]["grad_norm"] > 0
    if not torch.cuda.is_available():  # bit for bit
        assert moved["steps"] == plain["steps"] and all(torch.equal(before[k], after[k]) for k in before)
    else:  # two runs of the first step differ by CUDA's run-to-run noise (test_optimizer_resume.py's bound)
        assert moved["steps"][0] == pytest.approx(plain["steps"][0], rel=1e-3, abs=1e-6)
        assert max(((before[k] - after[k]).abs() - before[k].abs() * 2**-7).max().item() for k in before) <= 0.5e-3


def test_views_survive_and_zeroed_buffers_come_back_zero():
    buffer = torch.arange(12, dtype=torch.float32)
    view = buffer[4:8].view(2, 2)  # like a parameter viewing megatron's contiguous buffer
    grads = torch.ones(6)
    handover = MemoryHandover("cpu")
    stats = handover.release([view], zeroed=[grads])
    assert buffer.untyped_storage().nbytes() == 0 and grads.untyped_storage().nbytes() == 0
    assert stats.copied_gb * 2**30 == 48 and stats.released_gb * 2**30 == 72  # only the kept one is copied
    # the release's seconds split: the copies, and (on CUDA only) the memory's return to the driver
    assert 0 < stats.copy_s <= stats.seconds and stats.return_s == 0.0
    assert {"handover_copy_s", "handover_return_s", "handover_collect_s"} <= set(stats.metrics())
    handover.restore()
    assert torch.equal(buffer, torch.arange(12, dtype=torch.float32)) and torch.equal(view, buffer[4:8].view(2, 2))
    assert torch.equal(grads, torch.zeros(6))
    view.add_(1)  # the view still writes into the buffer's (new) memory
    assert buffer[4].item() == 5.0


def test_the_first_release_freezes_start_up_objects_and_later_garbage_is_still_collected():
    """A release collects garbage (a tensor kept alive only by a reference cycle holds memory the allocator cannot
    return); the first one freezes what is alive then, so later ones scan only what was made since, and a cycle
    made after the freeze is still collected by the next release."""
    start_up = [object() for _ in range(1000)]  # alive at the first release: frozen
    handover = MemoryHandover("cpu")
    weights = torch.ones(8)
    stats = handover.release([weights])
    assert gc.get_freeze_count() >= len(start_up) and stats.collect_s > 0
    handover.restore()

    class Node:
        pass

    node = Node()
    node.self, node.tensor = node, torch.ones(1024)  # garbage only a collection finds
    freed = weakref.ref(node.tensor)
    gc.disable()  # no automatic collection gets to it first
    try:
        del node
        assert freed() is not None
        handover.release([weights])
        assert freed() is None
    finally:
        gc.enable()
    handover.restore()
    assert torch.equal(weights, torch.ones(8))


def test_a_release_never_counts_the_frozen_objects(monkeypatch):
    """``gc.get_freeze_count()`` walks every frozen object to count them: 35-80 ms for a trainer rank's 390,000 on
    this project's CPU machine; on an H200 machine's rank a release's collection took 0.3-0.4 s with it, twice a
    colocated step. After the first release, releases neither count nor freeze again."""
    handover = MemoryHandover("cpu")
    weights = torch.ones(8)
    handover.release([weights])
    handover.restore()
    frozen = gc.get_freeze_count()
    counted = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: counted.append(1) or frozen)
    monkeypatch.setattr(gc, "freeze", lambda: counted.append("froze"))
    for _ in range(2):
        handover.release([weights])
        handover.restore()
    assert counted == []


def test_optimizer_state_comes_back_only_when_asked_for():
    """The optimizers' state leaves with the rest and stays away through ``restore`` (the forward and backward
    passes run without it) until ``restore_state``, values intact; a second release meanwhile leaves it as it is."""
    weights, moments = torch.arange(4, dtype=torch.float32), torch.full((3,), 2.5)
    handover = MemoryHandover("cpu")
    stats = handover.release([weights], state=[moments, weights])  # a master that is the weight comes back with it
    assert stats.copied_gb * 2**30 == 28 and moments.untyped_storage().nbytes() == 0
    assert handover.restore().released_gb * 2**30 == 16 and moments.untyped_storage().nbytes() == 0
    assert torch.equal(weights, torch.arange(4, dtype=torch.float32))
    assert handover.release([weights], state=[moments]).released_gb * 2**30 == 16  # the state is away already
    handover.restore()
    assert handover.restore_state().released_gb * 2**30 == 12 and torch.equal(moments, torch.full((3,), 2.5))
    assert handover.restore_state().released_gb == 0  # in place: nothing to do


def test_optimizer_state_kept_in_place_is_never_copied():
    """``keep_state`` (``--no-offload-optimizer-state``): the optimizers' state stays where it is, neither copied
    nor freed, while the rest goes; a master that is the weight itself still goes with the weight."""
    weights, moments = torch.arange(4, dtype=torch.float32), torch.full((3,), 2.5)
    handover = MemoryHandover("cpu")
    stats = handover.release([weights], state=[moments, weights], keep_state=True)
    assert stats.copied_gb * 2**30 == 16 and stats.released_gb * 2**30 == 16
    assert moments.untyped_storage().nbytes() == 12 and weights.untyped_storage().nbytes() == 0
    handover.restore()
    assert handover.restore_state().released_gb == 0 and torch.equal(moments, torch.full((3,), 2.5))
    assert torch.equal(weights, torch.arange(4, dtype=torch.float32))


def test_pinned_segments_are_named_largest_first():
    """The log line a hand-over prints when live blocks keep memory from the engines, on segments in
    ``torch.cuda.memory_snapshot()``'s format: the H100 case, a 1.1 MiB tensor in a 15 GiB classic segment."""
    mib, gib = 2**20, 2**30
    segments = [
        {"total_size": 15 * gib, "is_expandable": False,
         "blocks": [{"size": int(1.1 * mib), "state": "active_allocated"}, {"size": 15 * gib, "state": "inactive"}]},
        {"total_size": 40 * gib, "is_expandable": True,  # expandable: only its live pages count
         "blocks": [{"size": 2 * mib, "state": "active_allocated"}, {"size": 40 * gib, "state": "inactive"}]},
        {"total_size": 8 * gib, "is_expandable": False, "blocks": [{"size": 8 * gib, "state": "inactive"}]},
    ]
    line = describe_pinned_segments(segments)
    assert line.startswith("15.00 GiB pinned by live blocks: 15.00 GiB segment with 1.1 MiB in 1 live block(s)")
    assert describe_pinned_segments(segments[1:]) == ""  # nothing pinned: no line


PINNED_TAIL = """
import torch
from vime_ext.trainer.memory_handover import use_releasable_allocations
if {expandable}:
    use_releasable_allocations()
big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
del big
small = torch.empty(3 * 2**20 // 2, dtype=torch.uint8, device="cuda")  # carved from the big block's segment
torch.cuda.empty_cache()
print(torch.cuda.memory_reserved() / 2**20)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA caching allocator's segments")
def test_a_small_live_tensor_pins_only_its_pages_with_releasable_allocations():
    """What kept the KV cache from waking on the H100: a small tensor placed in a freed large block's segment
    keeps the whole classic segment; with the trainer's releasable allocations it keeps its own pages."""
    reserved = {flag: float(subprocess.run([sys.executable, "-c", PINNED_TAIL.format(expandable=flag)],
                                           check=True, capture_output=True, text=True).stdout.split()[-1])
                for flag in (False, True)}
    assert reserved[False] >= 256 and reserved[True] < 64


def test_host_memory_reports_each_phases_peak():
    """The peak host memory between two calls (a save's, on GPUs), not the process's whole life: a buffer
    touched and freed within a phase shows in that phase's peak, and not in the next one's. In a fresh process:
    in a long-lived test worker the buffer may land on pages already resident, and the peak would not move."""
    code = """if True:
        import gc, json, torch
        from vime_ext.trainer import memory_handover
        memory_handover.host_memory()
        buffer = torch.ones(256 * 2**20 // 4)  # 256 MiB, every page touched, then given back (mapped alone)
        del buffer
        gc.collect()
        phase = memory_handover.host_memory()
        print(json.dumps([phase, memory_handover.host_memory()]))"""
    phase, nothing = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                               text=True).stdout.split("\n")[-2])
    assert phase["host_peak_rss_gb"] > phase["host_rss_gb"] + 0.2
    assert nothing["host_peak_rss_gb"] < phase["host_peak_rss_gb"] - 0.2
