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


def test_each_rows_weights_are_labelled_by_what_they_are_compared_with(tmp_path, monkeypatch):
    """The GPU runs themselves cannot run here; what the table says of each row's weights is checked with each
    run's outcome given: against the clean run's weights when it saved some, else against the starting weights
    (read once, 8 GB for a 4B model), labelled by why."""
    import argparse
    import json

    import torch

    import tools.fault_suite as suite

    saved = {"clean_colocated": None, "engine_kill_colocated": {"w": torch.tensor([1.5])},
             "router_kill_colocated": {"w": torch.tensor([1.25])}}
    reads = []
    monkeypatch.setattr(suite, "visible_gpus", lambda: 1)
    row = {"fault": "", "outcome": "survived", "seconds": 1.0, "trained_rollouts": 4, "not_trained": 0,
           "restarts": "0/0/0", "injected": ""}
    monkeypatch.setattr(suite, "gpu_one", lambda fault, *_: {**row, "weights": saved[fault.name]})
    monkeypatch.setattr(suite, "final_weights", lambda save, it: reads.append(it) or {"w": torch.tensor([1.0])})

    def notes(only, no_clean):
        out = tmp_path / f"out_{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        suite.gpu_suite(argparse.Namespace(gpu=str(tmp_path), only=only, no_clean=no_clean), out)
        return {r["name"]: r.get("weights_note") for r in map(json.loads, (out / "results.jsonl").open())}

    # the clean run failed to save: the faults are measured from the start, and say so
    assert notes("engine_kill_colocated,router_kill_colocated", no_clean=False) == {
        "clean_colocated": None, "engine_kill_colocated": "the clean run saved no weights; 0.5 from the start",
        "router_kill_colocated": "the clean run saved no weights; 0.25 from the start"}
    assert reads == [0]
    assert notes("engine_kill_colocated", no_clean=True) == {
        "engine_kill_colocated": "no clean run; 0.5 from the start"}
    saved["clean_colocated"] = {"w": torch.tensor([1.25])}
    assert notes("engine_kill_colocated", no_clean=False) == {"clean_colocated": "clean: 0.25 from the start",
                                                              "engine_kill_colocated": "0.25"}
