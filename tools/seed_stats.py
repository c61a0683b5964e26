"""Is the first model better than the best of the others, at the level of seeds and item by item?

    python tools/seed_stats.py --key performance_delta \
        --model "SFT + RL=results/rl_s*.samples.jsonl" --model "SFT=results/sft_s*.samples.jsonl" \
        --model "no-op=results/noop.samples.jsonl"

Each ``--model NAME=GLOB`` names one file per seed of per-item rows (an evaluation's ``*.samples.jsonl``: one JSON
object per item, its id in ``_id``); ``--key`` is a field of those rows (or of their ``metrics``), or ``A-B`` for
the difference of two (``qa_after_unseen-qa_before_unseen``). Printed, and with ``--out`` written as JSON:

- every model's seed means of the key, their mean and 95% interval (Student's t over the seeds);
- the first model against the best other (the highest mean): the difference of the seed means with a 95%
  interval (Welch's t over both models' seeds; a model of one seed, or of seeds that all agree, adds no spread);
- item by item, paired: each item's value averaged over a model's seeds, the first model's minus the best
  other's, their mean with a 95% interval (t over the items), how many items gain and lose, and the share of
  the summed gain that the top 5% of items carry (a gain made by a few items is not a learned skill).

Every item must be in every file: a seed that dropped an item is an error that names it, not a smaller mean.
An item is known by its id without the folder of its data file (``val_eval.jsonl:6#0``): runs that wrote the same
questions to folders of their own (a sweep's variants) are compared item by item, and an item whose prompt
differs between files is an error, not a pair.
"""

import argparse
import glob
import hashlib
import json
import math
import statistics
import sys
from pathlib import Path

from scipy import stats

from vime_ext.data.prompt_dataset import json_lines


def item_id(row: dict) -> str:
    """``_id`` without the folders of the data file it names (``/run/v1/data/val.jsonl:6#0`` -> ``val.jsonl:6#0``)."""
    return str(row["_id"]).rpartition("/")[2]


def read_items(path: Path, key: str, prompts: dict[str, tuple[str, str]] | None = None) -> dict[str, float]:
    """Item id -> the key's value, from one seed's rows (gzipped as the records keep them, or not); a line that is
    not JSON or lacks a field is named. ``prompts`` (item id -> the first file's prompt digest and place) is
    shared by every file read, so that an id whose prompt differs from another file's is named."""
    first, _, second = key.partition("-")
    values = {}
    prompts = {} if prompts is None else prompts
    for where, row in json_lines(path):
        try:
            fields = {**row.get("metrics", {}), **row}  # an evaluation's row keeps the reward's figures in metrics
            value = float(fields[first]) - (float(fields[second]) if second else 0.0)
            item = item_id(row)
        except KeyError as err:
            raise ValueError(f"{where}: no field {err.args[0]!r}") from None
        values[item] = value
        if "prompt" in row:
            digest = hashlib.sha256(json.dumps(row["prompt"], sort_keys=True).encode()).hexdigest()
            seen, first_where = prompts.setdefault(item, (digest, where))
            if seen != digest:
                raise ValueError(f"{where}: item {item}'s prompt differs from the one at {first_where}")
    return values


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and 95% Student's t interval; one value, or values that all agree, give a point."""
    mean = statistics.fmean(values)
    if len(values) < 2 or len(set(values)) == 1:
        return mean, mean, mean
    half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Mean of a minus mean of b, with a 95% Welch interval (a sample without spread adds none)."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    va = statistics.variance(a) / len(a) if len(a) > 1 else 0.0
    vb = statistics.variance(b) / len(b) if len(b) > 1 else 0.0
    if va + vb == 0:
        return diff, diff, diff
    df = (va + vb) ** 2 / sum(v**2 / (n - 1) for v, n in ((va, len(a)), (vb, len(b))) if v > 0)
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    return diff, diff - half, diff + half


def compare(models: dict[str, list[dict[str, float]]]) -> dict:
    """``models``: name -> one dict (item id -> value) per seed, the first model first."""
    names = list(models)
    items = set(models[names[0]][0])
    for name, seeds in models.items():
        for i, seed in enumerate(seeds):
            if set(seed) != items:
                missing = sorted(items - set(seed))[:5]
                extra = sorted(set(seed) - items)[:5]
                raise ValueError(f"{name}, seed file {i}: its items differ from {names[0]}'s "
                                 f"(missing {missing}, not in {names[0]}: {extra})")
    seed_means = {name: [statistics.fmean(seed.values()) for seed in seeds] for name, seeds in models.items()}
    rows = {name: dict(zip(("mean", "low", "high"), interval(means)), seeds=means)
            for name, means in seed_means.items()}
    first, others = names[0], names[1:]
    result = {"items": len(items), "models": rows}
    if not others:
        return result
    best = max(others, key=lambda n: rows[n]["mean"])
    result["against"] = best
    result["seed_level"] = dict(zip(("difference", "low", "high"), welch(seed_means[first], seed_means[best])))
    per_item = {name: {i: statistics.fmean(seed[i] for seed in models[name]) for i in items} for name in (first, best)}
    gains = sorted((per_item[first][i] - per_item[best][i] for i in items), reverse=True)
    mean, low, high = interval(gains)
    positive = sum(g for g in gains if g > 0)
    top = gains[:max(1, math.ceil(0.05 * len(gains)))]
    result["paired"] = {"difference": mean, "low": low, "high": high, "gain": sum(g > 0 for g in gains),
                        "loss": sum(g < 0 for g in gains), "tie": sum(g == 0 for g in gains),
                        "top5pct_share_of_gain": sum(g for g in top if g > 0) / positive if positive else None,
                        "sum_without_top5pct": sum(gains[len(top):])}
    return result


def report(result: dict, key: str) -> str:
    lines = [f"{key}, {result['items']} items", "", "| model | seeds | mean | 95% interval |", "|---|---|---|---|"]
    for name, row in result["models"].items():
        # One seed has no spread to draw an interval from: say so rather than print a point as an interval.
        spread = f"{row['low']:.4f} to {row['high']:.4f}" if len(row["seeds"]) > 1 else "- (one seed)"
        lines.append(f"| {name} | {len(row['seeds'])} | {row['mean']:.4f} | {spread} |")
    if "against" in result:
        first = next(iter(result["models"]))
        s, p = result["seed_level"], result["paired"]
        share = "-" if p["top5pct_share_of_gain"] is None else f"{p['top5pct_share_of_gain']:.0%}"
        seeds = [len(result["models"][name]["seeds"]) for name in (first, result["against"])]
        seed_line = (f"- seeds: {s['difference']:+.4f} (95% {s['low']:+.4f} to {s['high']:+.4f})" if max(seeds) > 1
                     else f"- seeds: {s['difference']:+.4f} (one seed each: no seed-level interval)")
        lines += ["", f"{first} minus {result['against']} (the best other row):",
                  seed_line,
                  f"- item by item: {p['difference']:+.4f} (95% {p['low']:+.4f} to {p['high']:+.4f}); "
                  f"{p['gain']} items gain, {p['loss']} lose, {p['tie']} tie; the top 5% of items carry {share} "
                  f"of the gain (the rest sum to {p['sum_without_top5pct']:+.3f})"]
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--key", required=True, help="a per-item field, or A-B")
    parser.add_argument("--model", action="append", required=True, metavar="NAME=GLOB",
                        help="one file per seed; the first model is compared with the best of the others")
    parser.add_argument("--out", type=Path, help="the figures as JSON too")
    args = parser.parse_args(argv)
    models, prompts = {}, {}
    for spec in args.model:
        name, sep, pattern = spec.partition("=")
        files = sorted(glob.glob(pattern))
        if not sep or not name:
            parser.error(f"--model {spec!r}: write NAME=GLOB")
        if not files:
            parser.error(f"--model {spec!r}: no file matches {pattern}")
        models[name] = [read_items(Path(f), args.key, prompts) for f in files]
    result = compare(models)
    print(report(result, args.key))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
