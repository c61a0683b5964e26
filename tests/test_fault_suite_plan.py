"""The GPU fault suite's plan: a lease may end before its last row, so ``--only`` runs rows in the order given,
each after the clean run of its layout, and a misspelt name stops it before any GPU time is spent."""

import pytest

from tools.fault_suite import gpu_plan


def names(only):
    return [fault.name for _, (fault, _) in gpu_plan(only)]


def test_every_row_without_only():
    assert names(None)[0] == "clean" and "clean_colocated" in names(None) and len(names(None)) == 12


def test_one_gpu_runs_the_colocated_rows_and_refuses_the_others_by_name():
    """A lease of one GPU (the kind lent most often) holds the colocated layout only: trainer and engine apart
    need a GPU each."""
    one = [fault.name for _, (fault, _) in gpu_plan(None, gpus=1)]
    assert one == ["clean_colocated", "engine_kill_colocated", "trainer_kill_mid_step", "trainer_stop_mid_step",
                   "router_kill_colocated", "save_kill_colocated"]
    assert [f.name for _, (f, _) in gpu_plan("save_kill_colocated,router_kill_colocated", gpus=1)] == [
        "clean_colocated", "save_kill_colocated", "router_kill_colocated"]
    with pytest.raises(SystemExit, match="router_kill need trainer and engine on GPUs of their own.*has 1 GPU; on "
                                         "one: clean_colocated, engine_kill_colocated"):
        gpu_plan("router_kill", gpus=1)
    assert len(gpu_plan(None, gpus=0)) == 12  # the CPU dry run of this mode: both layouts


def test_only_keeps_its_order_and_each_layouts_clean_run_first():
    assert names("trainer_kill_mid_step,engine_kill_colocated,engine_kill_during_push") == [
        "clean_colocated", "trainer_kill_mid_step", "engine_kill_colocated", "clean", "engine_kill_during_push"]
    # The row number (its Ray port) is the row's place in the whole suite, whatever the order.
    assert [i for i, _ in gpu_plan("router_kill")] == [0, 8]


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(SystemExit, match="no GPU fault named engine_kil .*known: clean, engine_kill"):
        gpu_plan("engine_kil")


def test_no_clean_runs_only_the_named_rows():
    """A lease too short for the reference run (--no-clean): the named rows alone, in their order."""
    plan = gpu_plan("engine_kill_colocated,router_kill_colocated", gpus=1, clean_first=False)
    assert [f.name for _, (f, _) in plan] == ["engine_kill_colocated", "router_kill_colocated"]


def save_iteration(folder, value: float):
    """A one-tensor torch_dist iteration as the trainer saves one (torch.distributed.checkpoint, one process)."""
    import torch
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.tensor([value])}, checkpoint_id=str(folder), no_dist=True)
    return folder


def test_each_rows_weights_are_labelled_by_what_they_are_compared_with(tmp_path, monkeypatch):
    """The GPU runs themselves cannot run here; what the table says of each row's weights is checked with each
    run's outcome given: against the clean run's saved weights when it saved some, else against the starting
    weights, labelled by why. The weights are read in a child process (a 4B model's are 8 GB, and the suite's
    own process must not keep them through the next row); a clean run's final iteration is kept as the reference
    and a fault row's removed."""
    import argparse
    import json

    import tools.fault_suite as suite

    save_iteration(tmp_path / "qwen3-4b-random_torch_dist" / "iter_0000000", 1.0)
    saved = {"clean_colocated": None, "engine_kill_colocated": 1.5, "router_kill_colocated": 1.25}
    monkeypatch.setattr(suite, "visible_gpus", lambda: 1)
    row = {"fault": "", "outcome": "survived", "seconds": 1.0, "trained_rollouts": 4, "not_trained": 0,
           "restarts": "0/0/0", "injected": ""}

    def gpu_one(fault, layout, work, out, port):
        folder = suite.fresh_folder(out, fault)
        if saved[fault.name] is None:
            return {**row, "final": None}
        return {**row, "final": save_iteration(folder / "save" / "iter_0000004", saved[fault.name])}

    monkeypatch.setattr(suite, "gpu_one", gpu_one)

    def notes(only, no_clean):
        out = tmp_path / f"out_{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        suite.gpu_suite(argparse.Namespace(gpu=str(tmp_path), only=only, no_clean=no_clean), out)
        assert not list(out.glob("*/save/iter_*"))  # every row's iteration removed once compared
        return {r["name"]: r.get("weights_note") for r in map(json.loads, (out / "results.jsonl").open())}

    # the clean run failed to save: the faults are measured from the start, and say so
    assert notes("engine_kill_colocated,router_kill_colocated", no_clean=False) == {
        "clean_colocated": None, "engine_kill_colocated": "the clean run saved no weights; 0.5 from the start",
        "router_kill_colocated": "the clean run saved no weights; 0.25 from the start"}
    assert notes("engine_kill_colocated", no_clean=True) == {
        "engine_kill_colocated": "no clean run; 0.5 from the start"}
    saved["clean_colocated"] = 1.25
    out = tmp_path / f"out_{len(list(tmp_path.iterdir()))}"
    assert notes("engine_kill_colocated", no_clean=False) == {"clean_colocated": "clean: 0.25 from the start",
                                                              "engine_kill_colocated": "0.25"}
    assert (out / "clean_colocated_final" / ".metadata").is_file()  # the reference, kept on disk


def test_a_resumed_fault_that_never_fired_is_not_resumed(tmp_path):
    """A row whose first run ended before its fault (on one H200 the trainer's save once met Ray's OOM killer
    first) is that run's own end: its resume would report something else (there, a port still held)."""
    from tools.fault_suite import Fault, run_fault

    fault = Fault("save_kill", "", resume=True)
    first = ["bash", "-c", "echo first run; exit 1"]
    resume = ["bash", "-c", "echo resumed; exit 0"]
    code, _, log = run_fault(fault, first, resume, tmp_path, {})
    assert (code, log.name, log.read_text()) == (1, "run.log", "first run\n")
    (tmp_path / "injected").write_text("1 run killed while saving iteration 4")
    code, _, log = run_fault(fault, first, resume, tmp_path, {})
    assert (code, log.name, log.read_text()) == (0, "resume.log", "resumed\n")
