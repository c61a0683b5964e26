"""GPU sharing decided in one place (vime_ext/gpu_sharing.py): the mode from the flags, the engine count, the
engines' vLLM flags and transport, and the order of the colocated hand-over.

The hand-over's GPU branch (the trainer ranks hand their memory to the engines and back) needs CUDA and vLLM's
sleep mode; its order is checked here with a recorder in place of the ranks and the manager, and ran for real on
2 x H200 (docs/performance.md). The colocated loop on CPU engines runs for real in tests/train/test_train_loop.py."""

import json

import pytest

from vime_ext.arguments import parse_train_args
from vime_ext.gpu_sharing import COLOCATED_GPU_MEMORY, GpuSharing, Mode


@pytest.fixture
def base(tiny_hf_dirs, tmp_path) -> list[str]:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1 =", "label": "2"}) + "\n")
    return ["--hf-checkpoint", str(tiny_hf_dirs["qwen3"]), "--prompt-data", str(data)]


@pytest.mark.parametrize("flags, mode, engines", [
    ([], Mode.SEPARATE, 1),
    (["--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2"], Mode.SEPARATE, 2),
    (["--colocate", "--actor-num-gpus-per-node", "4"], Mode.COLOCATED, 4),
    (["--colocate", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus-per-engine", "2"], Mode.COLOCATED, 2),
    (["--colocate", "--async-training"], Mode.RESIDENT, 1),
    (["--colocate", "--no-offload-train", "--no-offload-rollout"], Mode.RESIDENT, 1),
])
def test_the_mode_and_engine_count_come_from_the_flags(base, flags, mode, engines):
    sharing = GpuSharing.from_config(parse_train_args(base + flags), on_gpu=True)
    assert sharing.mode is mode and sharing.num_engines == engines
    assert sharing.shares_gpus == (mode is not Mode.SEPARATE) and sharing.engines_sleep == (mode is Mode.COLOCATED)
    # Engines with GPUs of their own get a bundle of them; colocated ones use the trainer's.
    assert sharing.rollout_bundle_gpus(has_engines=True) == (0 if sharing.shares_gpus else sharing.rollout_gpus)


def test_engine_args_and_transport_follow_the_mode(base):
    colocated = GpuSharing.from_config(parse_train_args(base + ["--colocate"]), on_gpu=True)
    assert colocated.engine_args(["--seed", "1"], engines_on_gpu=True) == [
        "--seed", "1", "--gpu-memory-utilization", str(COLOCATED_GPU_MEMORY), "--tensor-parallel-size", "1",
        "--enable-sleep-mode"]
    user_share = colocated.engine_args(["--gpu-memory-utilization", "0.7"], True)
    assert user_share.count("--gpu-memory-utilization") == 1 and "0.7" in user_share
    assert colocated.transport(engines_on_gpu=True) == "ipc" and colocated.transport(engines_on_gpu=False) == "vime_shm"
    resident = GpuSharing.from_config(parse_train_args(base + ["--colocate", "--async-training"]), on_gpu=True)
    assert "--enable-sleep-mode" not in resident.engine_args([], True) and resident.transport(True) == "ipc"
    separate = GpuSharing.from_config(parse_train_args(base), on_gpu=True)
    assert separate.engine_args([], True) == ["--tensor-parallel-size", "1"] and separate.transport(True) == "nccl"
    assert separate.engine_args(["--seed", "1"], engines_on_gpu=False) == ["--seed", "1"]


def test_engines_sharing_a_gpu_split_its_engine_share_and_need_colocation(base):
    """--rollout-engines-per-gpu N: N engines on each engine's GPUs, each with 1/N of the engines' memory share
    (the user's or the default); refused for engines on GPUs of their own, whose NCCL group cannot hold two
    members on one GPU."""
    from vime_ext.arguments import ConfigError
    from vime_ext.engines.servers import flag_value

    two = GpuSharing.from_config(parse_train_args(
        base + ["--colocate", "--actor-num-gpus-per-node", "4", "--rollout-engines-per-gpu", "2"]), on_gpu=True)
    assert two.num_engines == 8 and two.placement_problems() == []
    assert flag_value(two.engine_args([], True), "--gpu-memory-utilization") == str(COLOCATED_GPU_MEMORY / 2)
    split = two.engine_args(["--gpu-memory-utilization=0.5"], True)
    assert [a for a in split if "gpu-memory" in a] == ["--gpu-memory-utilization"]
    assert flag_value(split, "--gpu-memory-utilization") == "0.25"
    assert two.place_separate(None).gpus == ((),) * 8  # on a CPU: eight engine processes
    with pytest.raises(ConfigError, match="--rollout-engines-per-gpu 2 needs --colocate"):
        parse_train_args(base + ["--rollout-engines-per-gpu", "2"])
    with pytest.raises(ConfigError, match="--rollout-engines-per-gpu 0: at least 1"):
        parse_train_args(base + ["--colocate", "--rollout-engines-per-gpu", "0"])


class Recorder:
    """Stands in for the trainer ranks and the rollout manager: records the calls, in order."""

    def __init__(self):
        self.calls = []

    def __len__(self):
        return 2

    def memory(self):
        self.calls.append("ranks.memory")
        return [{"allocated_gb": 1.0}, {"allocated_gb": 2.0}]

    def release_memory(self, keep_weights=False):
        self.calls.append(f"ranks.release(keep_weights={keep_weights})")
        return [{}, {}]

    def restore_memory(self):
        self.calls.append("ranks.restore")
        return [{}, {}]

    def sleep(self):
        self.calls.append("engines.sleep")

    def wake_up(self, tags=None):
        self.calls.append(f"engines.wake_up({tags})")


def test_the_colocated_hand_over_never_holds_two_full_sets_of_memory(base):
    sharing = GpuSharing.from_config(parse_train_args(base + ["--colocate"]), on_gpu=True)
    both = Recorder()
    times, memory = {}, {}
    sharing.to_trainer(both, both, times, memory)
    assert both.calls == ["ranks.memory", "engines.sleep", "ranks.restore"]
    assert memory["rollout_allocated_gb"] == 2.0  # the largest over the ranks
    both.calls.clear()
    sharing.to_engines(lambda: both.calls.append("push") or 0.5, both, both, times, memory)
    assert [c for c in both.calls if c != "ranks.memory"] == [
        "ranks.release(keep_weights=True)", "engines.wake_up(['weights'])", "push", "ranks.release(keep_weights=False)",
        "engines.wake_up(['kv_cache'])"]
    assert times["weight_sync"] == 0.5 and {"sleep", "reload", "offload", "wake_up"} <= set(times)


@pytest.mark.parametrize("flags", [[], ["--colocate", "--async-training"],
                                   ["--colocate", "--no-offload-train", "--no-offload-rollout"]])
def test_engines_that_do_not_sleep_only_receive_the_push(base, flags):
    sharing = GpuSharing.from_config(parse_train_args(base + flags), on_gpu=True)
    both, times, memory = Recorder(), {}, {}
    sharing.to_trainer(both, both, times, memory)
    sharing.to_engines(lambda: both.calls.append("push") or 0.1, both, both, times, memory)
    assert both.calls == ["ranks.memory", "push"] and times == {"weight_sync": 0.1}
    assert memory == {"train_allocated_gb": 2.0}  # the step's memory, logged in every mode


def test_start_up_hand_overs(base):
    colocated = GpuSharing.from_config(parse_train_args(base + ["--colocate"]), on_gpu=True)
    resident = GpuSharing.from_config(parse_train_args(base + ["--colocate", "--async-training"]), on_gpu=True)
    for sharing, expected in ((colocated, ["ranks.release(keep_weights=False)"]),
                              (resident, ["ranks.release(keep_weights=False)", "ranks.restore"])):
        ranks = Recorder()
        sharing.before_engines_start(ranks)
        sharing.after_engines_start(ranks)
        assert ranks.calls == expected
    on_cpu = GpuSharing.from_config(parse_train_args(base + ["--colocate"]), on_gpu=False)
    ranks = Recorder()
    on_cpu.before_engines_start(ranks)
    assert ranks.calls == []  # nothing to hand over without a GPU; the engines still sleep and wake
    assert on_cpu.engines_sleep


def test_resident_in_the_synchronous_loop_takes_both_offload_flags(base):
    """slime's --offload-train/--offload-rollout: colocated trainer and engines hand the GPU over to each other
    (default) or, with both off, stay resident side by side; one of the two alone, or either without --colocate,
    is refused with the reason."""
    from vime_ext.arguments import ConfigError

    resident = GpuSharing.from_config(parse_train_args(base + ["--colocate", "--no-offload-train",
                                                               "--no-offload-rollout"]), on_gpu=True)
    ranks = Recorder()
    resident.before_engines_start(ranks)
    resident.after_engines_start(ranks)
    assert ranks.calls == ["ranks.release(keep_weights=False)", "ranks.restore"]  # as --async-training's
    assert "--enable-sleep-mode" not in resident.engine_args([], True)
    for flags, reason in ((["--colocate", "--no-offload-train"], "or neither does"),
                          (["--colocate", "--no-offload-rollout"], "or neither does"),
                          (["--no-offload-train", "--no-offload-rollout"], "without --colocate nothing is offloaded"),
                          (["--colocate", "--no-offload-train", "--no-offload-rollout", "--engine-sleep-level", "2"],
                           "resident engines never sleep")):
        with pytest.raises(ConfigError, match=reason):
            parse_train_args(base + flags)


def test_the_synchronous_loop_runs_resident_with_no_hand_over(tmp_path):
    """train.py --colocate --no-offload-train --no-offload-rollout on the CPU (transformers engine, no Ray): each
    step pushes the weights and nothing else between generating and training: no sleep, wake, reload or offload."""
    from tests.train.test_train_loop import metrics, tiny_model_dir, train
    from vime_ext.data.synthetic import write_jsonl

    model, data = tiny_model_dir(tmp_path), write_jsonl(tmp_path / "arith.jsonl", "arithmetic", 8)
    train(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
           "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8", "--global-batch-size", "4",
           "--num-rollout", "2", "--engine-backend", "hf", "--no-ray", "--colocate", "--no-offload-train",
           "--no-offload-rollout", "--tensorboard-dir", str(tmp_path / "tb")], tmp_path / "train.log")
    steps = metrics(tmp_path / "tb")
    assert sorted(steps) == [0, 1]
    for row in steps.values():
        assert "time/weight_sync" in row and "time/train" in row
        assert not {"time/sleep", "time/wake_up", "time/reload", "time/offload"} & set(row)


def test_memory_left_after_the_hand_over_that_grows_every_step_is_named():
    """The trainer's memory left after each hand-over, as W2's runs logged it (records/peers_w2_h200_run3): the
    two-engine run's grew by a copy of the weights a step (warned once it has grown twice in a row); the
    one-engine run's stayed put, as did a run whose first step made the optimizer state (one growth only)."""
    from vime_ext.driver.handover import ReleaseWatch

    leaking = ReleaseWatch()
    notes = [leaking.add({"released_allocated_gb": gb}) for gb in (52.51, 60.0, 67.5)]
    assert notes[:2] == [None, None]
    assert notes[2] == ("the trainer's GPU memory left after the hand-over grew at each of the last 2 steps (52.51, "
                        "60.00, 67.50 GiB): something keeps GPU memory every step, and the engines will run out of "
                        "room to wake")
    steady, first_step = ReleaseWatch(), ReleaseWatch()
    assert [steady.add({"released_allocated_gb": 0.06}) for _ in range(7)] == [None] * 7
    assert [first_step.add({"released_allocated_gb": gb}) for gb in (0.06, 45.0, 45.0, 45.1)] == [None] * 4
    assert ReleaseWatch().add({"train_allocated_gb": 2.0}) is None  # no hand-over (not colocated): nothing to watch


class LeakyRanks(Recorder):
    """Trainer ranks and rollout manager whose memory left after the release grows by 7.5 GiB a push."""

    def __init__(self):
        super().__init__()
        self.left = 45.0

    def release_memory(self, keep_weights=False):
        super().release_memory(keep_weights)
        if not keep_weights:
            self.left += 7.5
        return [{"allocated_gb": self.left}]

    def push_weights(self, target, bucket_bytes):
        self.calls.append("push")

    def begin_weight_update(self):
        pass

    def weight_target(self):
        return None

    def finish_weight_update(self, version):
        pass


def test_the_driver_warns_of_a_hand_over_that_leaks_at_every_step(base, capsys):
    from types import SimpleNamespace

    from vime_ext.driver.handover import HandOver

    ranks = LeakyRanks()
    sharing = GpuSharing.from_config(parse_train_args(base + ["--colocate"]), on_gpu=True)
    handover = HandOver(SimpleNamespace(sharing=sharing, manager=ranks, ranks=ranks, has_engines=True,
                                        has_actors=True))
    for version in range(3):
        handover.to_engines(version, {}, {})
        assert ("grew at each of the last 2 steps" in capsys.readouterr().out) == (version == 2)
