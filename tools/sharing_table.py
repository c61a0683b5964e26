"""Per-phase seconds of training runs that differ in how engines and trainer share the GPUs: one row per run
(a ``metrics.jsonl`` of ``--tensorboard-dir``), the median of each phase over the rollouts after the first
(which compiles, warms caches and fills the engines' prefix caches from nothing), and the step's ratio to the
first row's.

    python tools/sharing_table.py "colocated, 4 GPUs=RUN_A/metrics.jsonl" "separate, 4 GPUs=RUN_B/metrics.jsonl"

Hand-over: the engines' sleep and wake-up and the trainer ranks' release and reload of their memory (colocated
only); push: the weight transfer itself; step: the whole step less its checkpoint save (a run saves at its end,
which would otherwise decide the median of a short run).
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.scaling_table import training_rollouts  # noqa: E402

HANDOVER = ("time/sleep", "time/reload", "time/offload", "time/wake_up")
PHASES = [("rollout s", ("time/rollout",)), ("log-probs s", ("time/log_probs",)), ("train s", ("time/train",)),
          ("hand-over s", HANDOVER), ("push s", ("time/weight_sync",)), ("step s", ("time/total",))]
NEGATIVE = {"step s": ("time/save",)}  # subtracted from the phase


def phase_medians(path: Path) -> dict[str, float]:
    """Each phase's median over the training rollouts after the first; a phase a run never logs is 0."""
    rows = training_rollouts(path)
    def seconds(row: dict, name: str, keys: tuple[str, ...]) -> float:
        return sum(row.get(k, 0.0) for k in keys) - sum(row.get(k, 0.0) for k in NEGATIVE.get(name, ()))

    return {name: statistics.median(seconds(r, name, keys) for r in rows[1:]) for name, keys in PHASES}


def table(runs: list[tuple[str, Path]]) -> str:
    """One row per run; a run that stopped before its second training rollout gets a row that says so (the
    ratio is to the first run with figures)."""
    figures = []
    for label, path in runs:
        try:
            figures.append((label, phase_medians(path)))
        except ValueError as err:
            figures.append((label, str(err)))
    first = next((row["step s"] for _, row in figures if isinstance(row, dict)), None)
    lines = ["| run | " + " | ".join(name for name, _ in PHASES) + " | step vs first |",
             "|---" * (len(PHASES) + 2) + "|"]
    for label, row in figures:
        if isinstance(row, str):
            lines.append(f"| {label} | {row} |" + " |" * len(PHASES))
            continue
        lines.append(f"| {label} | " + " | ".join(f"{row[name]:.2f}" for name, _ in PHASES)
                     + f" | {first / row['step s']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="LABEL=PATH to a run's metrics.jsonl")
    args = parser.parse_args(argv)
    runs = []
    for run in args.runs:
        label, eq, path = run.rpartition("=")
        if not eq or not label:
            parser.error(f"{run!r}: give LABEL=PATH")
        runs.append((label, Path(path)))
    print(table(runs))


if __name__ == "__main__":
    main()
