"""Generated prompt data in the ``--prompt-data`` JSONL format, for tests and the offline demo.

    python -m vime_ext.data.synthetic --task arithmetic --num 64 --out data/arith.jsonl
"""

import argparse
import json
import random
from pathlib import Path


def arithmetic(rng: random.Random) -> dict:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    question = f"What is {a} + {b}? Put the final answer in \\boxed{{}}."
    return {"prompt": [{"role": "user", "content": question}], "label": str(a + b)}


def one_word(rng: random.Random) -> dict:
    """Questions whose reward (``vime_ext.rollout.rewards.starts_with_label``) asks for one exact word first."""
    thing = rng.choice(["the sky", "snow", "grass", "the sea", "coal", "milk", "a lemon", "an orange", "blood"])
    return {"prompt": [{"role": "user", "content": f"Is {thing} a colour? Answer with yes or no."}],
            "label": "no"}


TASKS = {"arithmetic": arithmetic, "one_word": one_word}


def write_jsonl(path: str | Path, task: str, num: int, seed: int = 0) -> Path:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(num):
            f.write(json.dumps({**TASKS[task](rng), "metadata": {"id": f"{task}-{seed}-{i}"}}) + "\n")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="arithmetic")
    parser.add_argument("--num", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    print(write_jsonl(args.out, args.task, args.num, args.seed))


if __name__ == "__main__":
    main()
