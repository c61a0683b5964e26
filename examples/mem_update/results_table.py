"""MemUpdate's held-out results side by side: rows are models (base, SFT, SFT + RL), each the mean over its seeds
with the range, from the summaries ``run-eval.sh`` wrote (``RESULTS/SAVE_FILE.json``).

    python -m examples.mem_update.results_table --results RESULTS --model base=base --model "SFT=sft_s*" \
        --model "SFT + RL=rl_s*" [--out records/mem_update_smollm2]

Writes ``OUT.md`` (QA before and after, their difference, the reward, the store and the calls per episode, then
the calls per tool, then the goal checked: SFT + RL above SFT on the QA difference and the reward) and
``OUT.json`` (every seed's summary and the means).
"""

import argparse
import json
import statistics
from pathlib import Path

from examples.mem_update.eval_mem_update import TOOL_NAMES
from examples.mem_update.tools import ERROR_KINDS
from vime_ext.evaluate import mean_and_range, model_groups
from vime_ext.reports import report

COLUMNS = [("qa_before", "QA before", 3), ("qa_after", "QA after", 3), ("qa_delta", "QA delta", 3),
           ("qa_delta_seen", "QA delta, seen question", 3), ("qa_delta_unseen", "QA delta, unseen questions", 3),
           ("reward", "reward", 3), ("final_memory_count", "memories after", 1),
           ("final_memory_chars", "characters after", 0), ("valid_tool_calls", "valid calls", 2),
           ("tool_errors", "errors", 2), ("store_edits", "edits", 2), ("unfinished", "unfinished", 2)]


def value(summary: dict, key: str) -> float | None:
    if key.startswith("calls_"):
        return (summary.get("calls_per_tool") or {}).get(key.removeprefix("calls_"))
    if key.startswith("errors_"):
        return (summary.get("errors_per_kind") or {}).get(key.removeprefix("errors_"))
    return summary.get(key)


def cell(summaries: list[dict], key: str, digits: int) -> str:
    return mean_and_range([v for v in (value(s, key) for s in summaries) if v is not None], digits)


def mean(summaries: list[dict], key: str) -> float | None:
    values = [v for v in (value(s, key) for s in summaries) if v is not None]
    return statistics.fmean(values) if values else None


def markdown(models: dict[str, list[dict]], sft: str, rl: str) -> str:
    def table(columns: list[tuple[str, str, int]]) -> list[str]:
        lines = ["| model | seeds | episodes | " + " | ".join(title for _, title, _ in columns) + " |",
                 "|---|---|---|" + "---|" * len(columns)]
        for name, summaries in models.items():
            episodes = "/".join(sorted({str(s["episodes"]) for s in summaries}))
            lines.append(f"| {name} | {len(summaries)} | {episodes} | "
                         + " | ".join(cell(summaries, key, digits) for key, _, digits in columns) + " |")
        return lines

    scorers = sorted({s.get("scorer", "from the settings") for summaries in models.values() for s in summaries})
    parts = table(COLUMNS) + ["", "Calls per episode by tool (those that ran):", ""]
    parts += table([(f"calls_{name}", name, 2) for name in TOOL_NAMES])
    parts += ["", "Failed calls per episode by what was wrong:", ""]
    parts += table([(f"errors_{kind}", kind, 2) for kind in ERROR_KINDS])
    parts += ["", f"Means over the seeds, (min-max) where they differ. QA scored by: {'; '.join(scorers)}."]
    if sft in models and rl in models:
        for key in ("qa_delta", "reward"):
            a, b = mean(models[rl], key), mean(models[sft], key)
            if a is not None and b is not None:
                parts.append(f"- {rl} against {sft}, {key}: {a:.3f} against {b:.3f} "
                             f"({'above' if a > b else 'not above'}; goal: above).")
    return "\n".join(parts)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", required=True, help="run-eval.sh's RESULTS folder")
    parser.add_argument("--model", action="append", required=True, help="NAME=PATTERN (a glob of SAVE_FILEs)")
    parser.add_argument("--sft", default="SFT", help="the model the goal compares against")
    parser.add_argument("--rl", default="SFT + RL", help="the model the goal is about")
    parser.add_argument("--out", required=True, help="path stem of the .md and .json written")
    args = parser.parse_args(argv)
    found = {p.stem: json.loads(p.read_text()) for p in sorted(Path(args.results).glob("*.json"))
             if not p.name.endswith(".samples.json")}
    groups = model_groups(args.model, list(found))
    models = {name: [found[f] for f in files] for name, files in groups.items()}
    text = markdown(models, args.sft, args.rl) + "\n"
    result = {name: {"seeds": {f: found[f] for f in files},
                     "means": {key: mean(models[name], key) for key, _, _ in COLUMNS}}
              for name, files in groups.items()}
    report(text, result, args.out)
    return result


if __name__ == "__main__":
    main()
