"""What a run's rollouts sampled, to read: rollouts saved by ``--save-debug-rollout-data`` written again without
their token lists (tokens, loss masks, log-probs, token versions, each cut turn's; most of a saved rollout), one
JSON line a sample, in the form of an evaluation's ``*.samples.jsonl`` plus ``rollout_id``, so that the tools
that read those read these (MemUpdate's ``edit_audit.py``: which memories GRPO's sampled episodes deleted).

    python tools/rollout_replies.py RUN/rollouts --out RUN/rollout_replies.jsonl.xz [--rollouts first,last]

``--rollouts``: ``all``, or ids, ``first`` and ``last`` separated by commas (default ``first,last``: where GRPO
started and where it ended). ``--out`` ending in ``.xz`` is compressed. Prints each kept rollout's samples, mean
reward and statuses.
"""

import argparse
import json
import lzma
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vime_ext.rollout.debug_data import debug_path, saved_rollout_ids  # noqa: E402

TOKEN_LISTS = ("tokens", "loss_mask", "rollout_log_probs", "token_versions", "turns")


def chosen_ids(spec: str, saved: list[int]) -> list[int]:
    """The saved ids ``spec`` names (see the module's doc); a named id that was not saved is an error."""
    if spec == "all":
        return saved
    ids = []
    for word in (w.strip() for w in spec.split(",") if w.strip()):
        if word in ("first", "last"):
            ids.append(saved[0] if word == "first" else saved[-1])
        elif word.isdigit() and int(word) in saved:
            ids.append(int(word))
        else:
            raise SystemExit(f"--rollouts: {word!r} is not a saved rollout (saved: {saved}), nor first, last or all")
    return sorted(set(ids))


def readable(sample: dict, rollout_id: int) -> dict:
    """A saved sample without its token lists, with the rollout it came from."""
    return {"rollout_id": rollout_id, **{k: v for k, v in sample.items() if k not in TOKEN_LISTS}}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rollouts", help="the run's --save-debug-rollout-data")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL to write (.xz: compressed)")
    parser.add_argument("--rollouts", dest="which", default="first,last", help="all, or ids/first/last by commas")
    args = parser.parse_args(argv)
    saved = saved_rollout_ids(args.rollouts)
    if not saved:
        raise SystemExit(f"{args.rollouts}: no saved rollout there (--save-debug-rollout-data writes them)")
    summary = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    opener = lzma.open if args.out.suffix == ".xz" else open
    with opener(args.out, "wt") as out:
        for rollout_id in chosen_ids(args.which, saved):
            path = debug_path(args.rollouts, rollout_id)
            try:
                groups = json.loads(path.read_text())["groups"]
            except (json.JSONDecodeError, KeyError) as err:
                raise SystemExit(f"{path}: not a saved rollout ({err})") from err
            samples = [s for group in groups for s in group]
            for sample in samples:
                out.write(json.dumps(readable(sample, rollout_id)) + "\n")
            rewards = [s["reward"] for s in samples if isinstance(s.get("reward"), (int, float))]
            summary.append({"rollout_id": rollout_id, "samples": len(samples),
                            "reward_mean": statistics.fmean(rewards) if rewards else None,
                            "statuses": dict(Counter(s.get("status") for s in samples))})
            print(json.dumps(summary[-1]))
    print(f"{args.out}: {sum(row['samples'] for row in summary)} samples of {len(summary)} rollouts")
    return summary


if __name__ == "__main__":
    main()
