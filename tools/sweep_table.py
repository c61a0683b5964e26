"""One row per variant of a knob sweep of either example's SmolLM2 recipe (``tools/gpu_learning.sh sweep``): the
SFT and SFT + RL models' scores, and whether GRPO had anything to learn from (the share of groups whose samples all
got the same reward, the mean |advantage|, the policy's entropy, its KL to the SFT model, MemUpdate's share of
unfinished episodes, the training reward, and at the first and last step MemUpdate's share of episodes that write
the demonstrations' rationale).

    python tools/sweep_table.py --variant "SFT_EPOCHS=1"=runs/sweep/v0 --variant ...=DIR --out runs/sweep/sweep

A variant's DIR is its recipe's VIME_EXT_OUT, with seed_<seed>/rl/tensorboard/metrics.jsonl and its evaluations:
MemAgent's sub-EM at each evaluated length (eval_val/ruler_hqa_<docs>/{sft,rl}_s<seed>.summary.json), MemUpdate's
QA delta, unseen and all (eval_val/{sft,rl}_s<seed>.json): both on the validation items, as a sweep scores them. Writes OUT.md and OUT.json
and prints the table, and OUT.png: per GRPO step, each variant's training reward and its share of groups of one
reward. A part a variant lacks (its GRPO failed, its evaluation was cut) is shown as "-".
"""

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.loop_efficiency import read_metrics  # noqa: E402
from vime_ext.reports import report  # noqa: E402

# Means over a variant's GRPO steps. "unfinished" (MemUpdate's episodes with no final reply: "-" for MemAgent) is
# how a policy that has learned to break its tool calls shows (the 1.5B policy at lr 2e-5, 2026-11-30).
SIGNALS = {"uniform groups": "rollout/uniform_reward_groups", "|adv|": "rollout/advantage_abs_mean",
           "entropy": "train/entropy", "KL": "train/kl", "unfinished": "rollout/unfinished"}
RATIONALE = "rollout/rationale"


def training_rows(path: Path) -> list[dict]:
    """The last line logged per rollout step that trained (evaluation lines carry no train/loss); none for a run
    that never logged a step."""
    if not path.is_file() or path.stat().st_size == 0:
        return []
    rows = {row["step"]: row for row in read_metrics(path) if "train/loss" in row}
    return [rows[k] for k in sorted(rows)]


def trained_model(save_file: str) -> str | None:
    """The model a seed's evaluation file is of: sft (sft_s0), rl (rl_s0), or None (the rows without training)."""
    return next((m for m in ("sft", "rl") if save_file.startswith(f"{m}_s")), None)


def scores(run: Path) -> dict[str, dict[str, dict]]:
    """Column -> model -> {"value", "scored"} on the validation items: MemAgent's sub-EM per length (in order of
    length), MemUpdate's QA delta."""
    columns: dict[str, dict[str, dict]] = {}
    mem_agent = sorted(run.glob("eval_val/ruler_hqa_*/*.summary.json"),
                       key=lambda p: int(p.parent.name.rsplit("_", 1)[1]))
    for summary in mem_agent:
        data = json.loads(summary.read_text())
        if model := trained_model(data["save_file"]):
            label = f"sub-EM ({summary.parent.name.rsplit('_', 1)[1]} docs, val)"
            columns.setdefault(label, {})[model] = {"value": data["sub_em"], "scored": data["scored"]}
    for summary in sorted(run.glob("eval_val/*_s*.json")):
        if model := trained_model(summary.stem):
            data = json.loads(summary.read_text())
            for label, key in (("QA delta unseen (val)", "qa_delta_unseen"), ("QA delta all (val)", "qa_delta")):
                columns.setdefault(label, {})[model] = {"value": data[key], "scored": data["episodes"]}
    return columns


def variant_row(name: str, run: Path) -> dict:
    row = {"variant": name, "dir": str(run), "scores": scores(run)}
    steps = [r for path in sorted(run.glob("seed_*/rl/tensorboard/metrics.jsonl")) for r in training_rows(path)]
    row["rl_steps"] = len(steps)
    for label, key in SIGNALS.items():
        values = [r[key] for r in steps if key in r]
        row[label] = mean(values) if values else None
    rewards = [r["rollout/reward_mean"] for r in steps]
    row["reward first/last"] = (rewards[0], rewards[-1]) if rewards else None
    # MemUpdate's share of episodes that write the demonstrations' rationale: GRPO once dropped it unseen
    rationale = [r[RATIONALE] for r in steps if RATIONALE in r]
    row["rationale first/last"] = (rationale[0], rationale[-1]) if rationale else None
    row["per step"] = {"reward": rewards, "uniform groups": [r.get(SIGNALS["uniform groups"]) for r in steps]}
    return row


def reward_limits(rows: list[dict]) -> tuple[float, float]:
    """The reward axis: from the lowest reward (or 0) to the highest (or 0), with a margin. MemUpdate's rewards
    are QA gains, small and often below 0, which a fixed 0 to 1 axis would flatten or cut off."""
    values = [v for r in rows for v in r["per step"]["reward"] if v is not None]
    low, high = min(values + [0.0]), max(values + [0.0])
    margin = 0.05 * (high - low) or 0.05
    return low - margin, high + margin


def plot(rows: list[dict], path: Path) -> None:
    """Per GRPO step: the training reward, and the share of groups whose samples all got one reward (what GRPO
    cannot learn from), a line per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for r in rows:
        for ax, key in zip(axes, ("reward", "uniform groups")):
            values = [(i, v) for i, v in enumerate(r["per step"][key]) if v is not None]
            if values:
                ax.plot(*zip(*values), marker="o", markersize=3, label=r["variant"] or "(the recipe)")
    for ax, title, limits in zip(axes, ("training reward", "share of groups of one reward"),
                                 (reward_limits(rows), (-0.02, 1.02))):
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.set_ylim(*limits)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.0, color="grey", linewidth=0.8)
    # Below the plots, a variant a line: a variant's name is its variables, often wider than a plot. The figure
    # grows by the legend's height, which the plots leave free.
    handles, labels = axes[0].get_legend_handles_labels()
    legend_in = 0.16 * len(labels) + 0.15
    fig.set_size_inches(10, 3.8 + legend_in)
    fig.legend(handles, labels, loc="lower center", ncol=1, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, legend_in / (3.8 + legend_in), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return " / ".join(fmt(v, 2) for v in value)
    return f"{value:.{digits}f}"


def markdown(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(label for r in rows for label in r["scores"]))  # in the order first met
    header = ["variant"] + [f"{m} {label}" for label in columns for m in ("SFT", "SFT + RL")] + \
        ["RL steps", *SIGNALS, "reward first / last", "rationale first / last"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["variant"] or "(the recipe)"]
        for label in columns:
            for m in ("sft", "rl"):
                got = r["scores"].get(label, {}).get(m)
                form = ".1f" if label.startswith("sub-EM") else "+.3f"  # sub-EM in points, a QA delta in F1
                cells.append(f"{got['value']:{form}} ({got['scored']})" if got else "-")
        cells += [str(r["rl_steps"])] + [fmt(r[label]) for label in SIGNALS] + [
            fmt(r["reward first/last"]), fmt(r["rationale first/last"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nscore (items scored); the signals are means over the GRPO steps.\n"


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, metavar="NAME=DIR",
                        help="a variant's name (its variables) and its recipe's output folder; repeatable")
    parser.add_argument("--out", required=True, help="OUT.md and OUT.json are written")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.variant:
        name, sep, folder = spec.rpartition("=")
        if not sep or not Path(folder).is_dir():
            parser.error(f"--variant {spec!r}: expected NAME=DIR with DIR a folder")
        rows.append(variant_row(name, Path(folder)))
    text = markdown(rows)
    report(text, rows, args.out)
    plot(rows, Path(args.out + ".png"))
    return rows


if __name__ == "__main__":
    main()
