"""The RL loop against its parts: each phase's seconds in the loop beside its standalone limit on the same GPU,
and loop efficiency = (sum of the standalone phases) / (the loop's step time).

    python tools/loop_efficiency.py --loop RUN/tensorboard/metrics.jsonl --replay replay.json \
        --train-only TRAIN_ONLY/tensorboard/metrics.jsonl [--weight-sync weight_sync.json] [--skip-first 1]

- ``--loop``: the loop run's metrics (``time/*`` and ``memory/*`` per rollout).
- ``--replay``: ``tools/replay_rollout.py`` on one of the loop's saved rollouts, the engine alone: rollout.
- ``--train-only``: ``train.py`` with the loop's flags plus ``--debug-train-only --load-debug-rollout-data``
  (the same saved rollouts through the trainer, no engine on the GPU): log-probs and training.
- ``--weight-sync``: ``tools/bench_weight_sync.py`` with the loop's transport: the push.
Loop figures are medians over the rollouts after ``--skip-first`` (warm-up) that did not save a checkpoint (the
save, every ``--save-interval`` rollouts, has its own row). Prints two Markdown tables: the
phases' seconds, then the GPU memory (GiB) the loop logged at each phase's end (``memory/<phase>_*``: the
trainer's allocated, reserved and peak; the device's used memory, engines included).
"""

import argparse
import json
import statistics
from pathlib import Path

from vime_ext.data.prompt_dataset import json_lines

# (metric, what it is); the loop's step time is time/total.
PHASES = [("rollout", "generation"), ("sleep", "engines to sleep"), ("reload", "trainer memory back"),
          ("log_probs", "old and reference log-probs"), ("train", "optimizer steps"), ("save", "checkpoint"),
          ("offload", "trainer memory to the engines"), ("wake_up", "engines awake"),
          ("weight_sync", "weight push")]
STANDALONE = ("rollout", "log_probs", "train", "weight_sync")
MEMORY_FIELDS = ("allocated_gb", "reserved_gb", "peak_allocated_gb", "device_used_gb")


def read_metrics(path: Path) -> list[dict]:
    """A run's ``metrics.jsonl``, gzipped or not; a line that is not JSON is named by file and line."""
    rows = [row for _, row in json_lines(path)]
    if not rows:
        raise ValueError(f"{path}: no rollouts logged")
    return rows


def after_warmup(rows: list[dict], skip_first: int) -> list[dict]:
    """The rollouts after the first ``skip_first``; all of them when a run is no longer than that."""
    return [r for r in rows if r.get("step", 0) >= skip_first] or rows


def median_of(rows: list[dict], key: str, where: Path) -> float | None:
    values = [r[key] for r in rows if key in r]
    if not values:
        return None
    if not all(isinstance(v, (int, float)) for v in values):
        raise ValueError(f"{where}: {key} is not a number in every rollout")
    return float(statistics.median(values))


def efficiency(loop: list[dict], replay: dict, train_only: list[dict], weight_sync: dict | None,
               paths: dict[str, Path]) -> tuple[list[tuple[str, str, float | None, float | None]], dict]:
    """Table rows (phase, meaning, loop seconds, standalone seconds) and the summary figures."""
    if "seconds" not in replay:
        raise ValueError(f"{paths['replay']}: no 'seconds' (not tools/replay_rollout.py output)")
    standalone = {"rollout": float(replay["seconds"]),
                  "log_probs": median_of(train_only, "time/log_probs", paths["train_only"]),
                  "train": median_of(train_only, "time/train", paths["train_only"]),
                  "weight_sync": None if weight_sync is None else float(weight_sync["push_s_median"])}
    # A checkpoint comes once per --save-interval rollouts, not every step: the step and its phases are those of
    # the rollouts without a save (the save has a row of its own), unless every rollout saved.
    steps = [r for r in loop if "time/save" not in r] or loop
    rows = [(name, meaning, median_of(loop if name == "save" else steps, f"time/{name}", paths["loop"]),
             standalone.get(name)) for name, meaning in PHASES]
    rows = [r for r in rows if r[2] is not None or r[3] is not None]
    step = median_of(steps, "time/total", paths["loop"])
    if step is None:
        raise ValueError(f"{paths['loop']}: no time/total")
    missing = [name for name in STANDALONE if standalone[name] is None]
    summary = {"loop_step_s": step, "standalone_sum_s": sum(v for v in standalone.values() if v is not None),
               "standalone_missing": missing}
    summary["efficiency"] = summary["standalone_sum_s"] / step
    loop_rollout = median_of(steps, "time/rollout", paths["loop"])
    summary["rollout_vs_standalone"] = loop_rollout / standalone["rollout"] if loop_rollout else None
    return rows, summary


def memory_rows(loop: list[dict], where: Path) -> list[tuple[str, list[float | None]]]:
    """(phase, median of each MEMORY_FIELDS) for every phase the loop logged memory at, in the order first seen."""
    phases: list[str] = []
    for row in loop:
        for key in row:
            if key.startswith("memory/") and key.endswith("_device_used_gb"):
                phase = key[len("memory/"):-len("_device_used_gb")]
                if phase not in phases:
                    phases.append(phase)
    return [(phase, [median_of(loop, f"memory/{phase}_{field}", where) for field in MEMORY_FIELDS])
            for phase in phases]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loop", type=Path, required=True)
    parser.add_argument("--replay", type=Path, required=True)
    parser.add_argument("--train-only", type=Path, required=True)
    parser.add_argument("--weight-sync", type=Path)
    parser.add_argument("--skip-first", type=int, default=1, help="warm-up rollouts left out of the medians")
    args = parser.parse_args(argv)
    paths = {"loop": args.loop, "replay": args.replay, "train_only": args.train_only}
    loop, train_only = (after_warmup(read_metrics(path), args.skip_first) for path in (args.loop, args.train_only))
    replay = json.loads(args.replay.read_text())
    weight_sync = json.loads(args.weight_sync.read_text()) if args.weight_sync else None
    rows, summary = efficiency(loop, replay, train_only, weight_sync, paths)
    print("| phase | | loop s | standalone s |\n|---|---|---|---|")
    for name, meaning, in_loop, alone in rows:
        print(f"| {name} | {meaning} | {'-' if in_loop is None else f'{in_loop:.2f}'} | "
              f"{'-' if alone is None else f'{alone:.2f}'} |")
    print(f"| step | | {summary['loop_step_s']:.2f} | {summary['standalone_sum_s']:.2f} |")
    ratio = summary["rollout_vs_standalone"]
    print(f"\nloop efficiency {summary['efficiency']:.2f} (goal >= 0.9); rollout in the loop "
          f"{'-' if ratio is None else f'{ratio:.2f}x'} its standalone time (goal <= 1.10x)"
          + (f"; not measured standalone: {', '.join(summary['standalone_missing'])}"
             if summary["standalone_missing"] else ""))
    memory = memory_rows(loop, args.loop)
    if memory:
        print("\n| GPU memory at the end of | trainer allocated | trainer reserved | trainer peak | device used |\n"
              "|---|---|---|---|---|")
        for phase, values in memory:
            print(f"| {phase} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in values) + " |")
    summary["memory"] = {phase: dict(zip(MEMORY_FIELDS, values)) for phase, values in memory}
    return summary


if __name__ == "__main__":
    main()
