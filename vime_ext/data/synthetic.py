"""Generated data in the ``--prompt-data`` JSONL formats, for tests and the offline demo: prompts with labels
for RL, and (``sft_*`` tasks) chats for SFT (``--input-key messages``).

    python -m vime_ext.data.synthetic --task arithmetic --num 64 --out data/arith.jsonl
    python -m vime_ext.data.synthetic --task sft_arithmetic --num 64 --out data/chats.jsonl
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
    """Questions whose reward (``vime_ext.agent.rewards.starts_with_label``) asks for one exact word first."""
    thing = rng.choice(["the sky", "snow", "grass", "the sea", "coal", "milk", "a lemon", "an orange", "blood"])
    return {"prompt": [{"role": "user", "content": f"Is {thing} a colour? Answer with yes or no."}],
            "label": "no"}


CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def sft_arithmetic(rng: random.Random) -> dict:
    """A demonstration chat: a sum worked out and boxed, then (every other chat) a product done with the
    calculator tool, boxed again; the tool's definition rides along as the chat's ``tools``."""
    a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
    messages = [{"role": "system", "content": "Solve the problem. Put the final answer in \\boxed{}."},
                {"role": "user", "content": f"What is {a} + {b}?"},
                {"role": "assistant", "content": f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."}]
    if rng.random() < 0.5:
        call = {"type": "function", "function": {"name": "calculator",
                                                 "arguments": {"expression": f"{a + b} * {c}"}}}
        messages += [{"role": "user", "content": f"Now multiply that by {c}."},
                     {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "content": str((a + b) * c)},
                     {"role": "assistant", "content": f"The answer is \\boxed{{{(a + b) * c}}}."}]
    return {"messages": messages, "tools": [CALCULATOR]}


TASKS = {"arithmetic": arithmetic, "one_word": one_word, "sft_arithmetic": sft_arithmetic}


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
