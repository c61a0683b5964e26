"""Per-phase figures of training runs (``metrics.jsonl`` under ``RUN/tb``, the run's layout in ``RUN/run.json``,
as ``tools/bench_mem_agent_scaling.sh`` writes them), one row per run, and each figure's ratio to the first
run's: how each phase scales with the GPUs.

    python tools/scaling_table.py RUN_2GPU RUN_4GPU RUN_8GPU [--out scaling.json]

Each figure is the median over a run's rollouts after the first (which compiles, warms caches and fills the
engines' prefix caches from nothing).
"""

import argparse
import json
import statistics
from pathlib import Path

from vime_ext.data.prompt_dataset import json_lines

# (metric in metrics.jsonl, column heading); per-second rates grow with GPUs, seconds shrink.
COLUMNS = [("rollout/tokens_per_s", "rollout tok/s"), ("train/tokens_per_s", "train tok/s"),
           ("time/rollout", "rollout s"), ("time/log_probs", "log-probs s"), ("time/train", "train s"),
           ("time/weight_sync", "weight push s"), ("time/total", "step s")]


def training_rollouts(metrics_path: Path) -> list[dict]:
    """The training rollouts' lines of a ``metrics.jsonl`` (evaluation lines carry no step figures); a line that
    is not JSON is named by file and line. At least two: the first is left out as warm-up."""
    rows = [r for _, r in json_lines(metrics_path) if "time/total" in r]
    if len(rows) < 2:
        raise ValueError(f"{metrics_path}: {len(rows)} training rollouts; the table needs 2 or more (the first "
                         "is left out as warm-up)")
    return rows


def read_run(layout: dict, metrics_path: Path) -> dict:
    """The run's ``layout`` (gpus, actor_gpus, rollout_gpus, tp) and the median of each column over its rollouts
    after the first."""
    rows = training_rollouts(metrics_path)
    figures = {}
    for key, _ in COLUMNS:
        values = [r[key] for r in rows[1:] if key in r]
        if not values:
            raise ValueError(f"{metrics_path}: no rollout logs {key}")
        figures[key] = statistics.median(values)
    return {**layout, "rollouts": len(rows) - 1, "figures": figures}


def table(runs: list[dict]) -> str:
    """Markdown: one row per run, each figure followed by its ratio to the first run's."""
    head = ["GPUs", "trainer / engines", *(name for _, name in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = runs[0]["figures"]
    for run in runs:
        cells = [str(run["gpus"]), f"{run['actor_gpus']} (TP {run['tp']}) / {run['rollout_gpus']}"]
        for key, _ in COLUMNS:
            value = run["figures"][key]
            cells.append(f"{value:,.1f} ({value / base[key]:.2f}x)" if base[key] else f"{value:,.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run folders, smallest first")
    parser.add_argument("--out", help="write the runs' figures as JSON here")
    args = parser.parse_args(argv)
    runs = [read_run(json.loads(Path(folder, "run.json").read_text()), Path(folder, "tb", "metrics.jsonl"))
            for folder in args.runs]
    print(table(runs))
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
