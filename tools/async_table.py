"""Synchronous against asynchronous training at equal samples: wall seconds per trained sample, from two runs of
the same flags, one with ``--async-training --max-staleness 0`` (the synchronous steps, in the same memory
layout) and one with a bound K >= 1.

    python tools/async_table.py --sync SYNC/tensorboard/metrics.jsonl --async ASYNC/tensorboard/metrics.jsonl \
        [--skip-first 1]

A step's wall time is ``time/total`` (its wait for the rollout plus its training and push) less any save, so
the sum over the rollouts after ``--skip-first`` (start-up) is the run's wall time without checkpoints. Prints a Markdown table and the speed-up.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.loop_efficiency import read_metrics  # noqa: E402


def summary(rows: list[dict], skip_first: int) -> dict[str, float]:
    rows = [r for r in rows if "time/total" in r and "train/sequences" in r][skip_first:]
    if not rows:
        raise ValueError("no trained rollout after --skip-first")
    samples = sum(r["train/sequences"] / r.get("rollout/sequences_per_sample", 1.0) for r in rows)
    wall = sum(r["time/total"] - r.get("time/save", 0.0) for r in rows)  # saves are not what is compared
    return {"rollouts": len(rows), "samples": samples, "wall_s": wall, "s_per_sample": wall / samples,
            "reward": sum(r["rollout/reward_mean"] for r in rows) / len(rows),
            "staleness_max": max(r.get("rollout/staleness_max", 0.0) for r in rows),
            "wait_s": sum(r.get("time/wait_rollout", 0.0) for r in rows)}


def table(sync: dict[str, float], asynchronous: dict[str, float]) -> str:
    lines = ["| run | rollouts | samples | wall s | s / sample | waiting for rollouts, s | mean reward | "
             "max staleness |", "|---|---|---|---|---|---|---|---|"]
    for name, s in (("synchronous (K=0)", sync), ("asynchronous", asynchronous)):
        lines.append(f"| {name} | {s['rollouts']} | {s['samples']:.0f} | {s['wall_s']:.1f} | "
                     f"{s['s_per_sample']:.3f} | {s['wait_s']:.1f} | {s['reward']:.3f} | {s['staleness_max']:.0f} |")
    lines.append(f"\nspeed-up (synchronous s/sample over asynchronous): "
                 f"{sync['s_per_sample'] / asynchronous['s_per_sample']:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sync", type=Path, required=True)
    parser.add_argument("--async", dest="asynchronous", type=Path, required=True)
    parser.add_argument("--skip-first", type=int, default=1)
    args = parser.parse_args(argv)
    print(table(summary(read_metrics(args.sync), args.skip_first),
                summary(read_metrics(args.asynchronous), args.skip_first)))


if __name__ == "__main__":
    main()
