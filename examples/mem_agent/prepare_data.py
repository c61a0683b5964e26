"""Training data for MemAgent: MemAgent's HotpotQA rows (parquet, or JSONL with the same fields) -> the training
JSONL vime_ext reads, every row validated (bad rows are reported by index and skipped, good rows kept); or
generated HotpotQA-style data for offline runs and tests.

    python -m examples.mem_agent.prepare_data --input hotpotqa_train.parquet --out data/train.jsonl
    python -m examples.mem_agent.prepare_data --generate --num 256 --num-docs 8 --out data/train.jsonl \
        [--eval-dir data/eval --eval-lengths 8 16 --eval-num 32] [--hops 2] [--seed 0]
        [--entities train --eval-entities heldout]   # eval questions on names no training item has
        [--val-dir data/val --val-lengths 8]         # validation files: other items drawn as the eval ones

The validation files are for choosing settings (a sweep's knobs), so that the eval files are scored once, with the
setting chosen: the same names and lengths as the eval files, drawn with another seed.
"""

import argparse
import json
import sys
from pathlib import Path

from examples.mem_agent.data import (ENTITY_POOLS, DataError, item_from_training_row, write_eval_file,
                                     write_training_jsonl)


def read_rows(path: Path):
    """(where, row) pairs from a parquet or JSONL file; an unreadable JSONL line comes as (where, DataError)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path} row {i}", row
        return
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{path}:{number}", DataError(f"{path}:{number}: not valid JSON ({err.msg})")


def convert(source: Path, out: Path) -> tuple[int, list[str]]:
    """Write the good rows of ``source`` to ``out``; returns (rows kept, one message per skipped row)."""
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file")
    out.parent.mkdir(parents=True, exist_ok=True)
    kept, skipped = 0, []
    tmp = out.with_suffix(out.suffix + ".partial")
    with tmp.open("w", encoding="utf-8") as sink:
        for where, row in read_rows(source):
            try:
                if isinstance(row, DataError):
                    raise row
                sink.write(json.dumps(item_from_training_row(row, where).training_row()) + "\n")
                kept += 1
            except DataError as err:
                skipped.append(str(err))
    tmp.replace(out)
    return kept, skipped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="MemAgent training data: convert HotpotQA rows or generate data")
    parser.add_argument("--input", help="MemAgent's HotpotQA training parquet (or JSONL with its fields)")
    parser.add_argument("--out", required=True, help="training JSONL to write")
    parser.add_argument("--generate", action="store_true", help="generate multi-hop data instead of converting")
    parser.add_argument("--num", type=int, default=256, help="generated training questions")
    parser.add_argument("--num-docs", type=int, default=8, help="documents per generated training question")
    parser.add_argument("--max-docs", type=int, help="draw each question's document count log-uniformly "
                        "from [--num-docs, --max-docs]: a long tail of chunk counts")
    parser.add_argument("--hops", type=int, choices=[1, 2], default=2, help="documents each answer needs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--entities", choices=sorted(ENTITY_POOLS), default="all",
                        help="names the training items draw from: train and heldout are disjoint halves")
    parser.add_argument("--eval-entities", choices=sorted(ENTITY_POOLS), default="all",
                        help="names the eval files draw from (heldout: none a --entities train item names)")
    parser.add_argument("--eval-dir", help="also write generated eval_{N}.json files here")
    parser.add_argument("--eval-lengths", type=int, nargs="*", default=[], help="N (documents) of each eval file")
    parser.add_argument("--eval-num", type=int, default=32, help="questions per eval file")
    parser.add_argument("--val-dir", help="also write generated validation eval_{N}.json files here (another seed)")
    parser.add_argument("--val-lengths", type=int, nargs="*", help="N of each validation file (default: "
                        "--eval-lengths)")
    args = parser.parse_args(argv)
    if args.generate == bool(args.input):
        parser.error("give either --input FILE or --generate")
    if args.generate:
        print(write_training_jsonl(args.out, args.num, args.num_docs, args.seed, args.hops, args.max_docs,
                                   ENTITY_POOLS[args.entities]))
        held_out = [(args.eval_dir or Path(args.out).parent, args.eval_lengths, args.seed + 1)]
        if args.val_dir:
            held_out.append((args.val_dir, args.eval_lengths if args.val_lengths is None else args.val_lengths,
                             args.seed + 2))
        for folder, lengths, seed in held_out:
            for n in lengths:
                print(write_eval_file(folder, n, args.eval_num, seed, args.hops, ENTITY_POOLS[args.eval_entities]))
        return 0
    try:
        kept, skipped = convert(Path(args.input), Path(args.out))
    except FileNotFoundError as err:
        print(f"prepare_data: {err}", file=sys.stderr)
        return 2
    for message in skipped:
        print(f"skipped: {message}", file=sys.stderr)
    print(f"{args.out}: {kept} rows kept, {len(skipped)} skipped")
    return 0 if kept else 1


if __name__ == "__main__":
    raise SystemExit(main())
