"""Which HotpotQA dev questions a model answers with no document: MemAgent's filter, run through the framework's
evaluation loop.

    python -m examples.mem_agent.closed_book --model-path HF_DIR --out-dir DIR [--first 512] [--seed 0]
        [--source WHEEL] [--max-new-tokens 512] [--engine-backend vllm|hf] [--engine-dtype float32]
        [--n-proc 64] [--vllm-X ...]

MemAgent built its RULER-HQA test set from dev questions that none of its base models answered without the
document (facts from its ``taskutils/memory_data/filter.py``): each question alone, followed by "Your final answer
in \\boxed{}.", as one user message; 2 samples at temperature 1, top-p 0.7, at most 512 new tokens; a question
counts as answered when any sample holds the gold answer anywhere (case-insensitive) or boxes it. MemAgent asked
two models (Qwen2.5-7B and its instruct version); here each model is one run of this command, and
``hotpotqa_dev --closed-book`` drops the questions any of the given runs answered.

The questions are taken in the order the splits draw them (``--seed``, as ``hotpotqa_dev``'s), the first
``--first`` of it (0: all 7,405), so a check of a few hundred is enough to fill the test and validation splits.
Writes ``DIR/prompts.jsonl``, ``DIR/samples.jsonl`` (every sample and its verdict; resumable: a second run goes
on where the first stopped) and ``DIR/closed_book.json`` (the model, the questions checked, those answered). A
question whose sample failed twice is not checked, and the command exits with status 3 after writing the file.
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from examples.mem_agent.hotpotqa_dev import HotpotDev, installed_source, read_hotpotqa, split_order
from examples.mem_agent.scoring import extract_answer, squash

PROMPT = "{question}\nYour final answer in \\boxed{{}}.\n"
SAMPLES, TEMPERATURE, TOP_P, MAX_NEW_TOKENS = 2, 1.0, 0.7, 512  # MemAgent's filter settings


def answers_it(response: str, gold: str) -> bool:
    """MemAgent's verdict on one sample: the gold answer anywhere in it (lower case), or its last ``\\boxed{}``
    (within the last 300 characters) equal to the gold answer (lower case, white space removed)."""
    boxed = extract_answer(response, "boxed")
    return gold.lower() in response.lower() or (boxed is not None and squash(boxed) == squash(gold))


def answered(args, sample) -> float:
    """The reward plug-in of the check (``--custom-rm-path``): 1 when the sample answers its question."""
    return float(answers_it(sample.response, sample.label))


@dataclass(frozen=True)
class ClosedBook:
    model: str
    samples: int
    checked: tuple[int, ...]  # dev-file positions of the questions every sample of which was scored
    answered: tuple[int, ...]  # those of them that some sample answered

    @classmethod
    def read(cls, path: str | Path) -> "ClosedBook":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(str(data["model"]), int(data["samples"]), tuple(map(int, data["checked"])),
                       tuple(map(int, data["answered"])))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: not a closed-book file of examples.mem_agent.closed_book ({err})") from err

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")
        return path


def write_prompts(dev: HotpotDev, questions: list[int], path: Path) -> Path:
    """One prompt row per question (the JSONL ``vime_ext.evaluate`` reads), its dev position in the metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for q in questions:
            question = dev.questions[q]
            f.write(json.dumps({"prompt": [{"role": "user", "content": PROMPT.format(question=question.question)}],
                                "label": question.answer, "metadata": {"index": q}}) + "\n")
    return path


def tally(samples_path: Path, model: str, samples: int) -> ClosedBook:
    """The verdicts in ``samples_path`` per question: checked once all its samples are scored."""
    scored: dict[int, dict[str, float]] = {}  # by question, each sample's verdict by its id (a row once)
    for line in samples_path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        scored.setdefault(int(row["metadata"]["index"]), {})[row["_id"]] = float(row["reward"] or 0.0)
    checked = sorted(q for q, rewards in scored.items() if len(rewards) >= samples)
    return ClosedBook(model, samples, tuple(checked), tuple(q for q in checked if max(scored[q].values()) > 0))


def main(argv=None) -> ClosedBook:
    from vime_ext.engines.servers import split_vllm_args
    from vime_ext.evaluate import evaluate, exit_if_unscored

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="HF directory of the model asked")
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--source", type=Path, help="the dev set's wheel or JSON (default: the installed package's)")
    parser.add_argument("--first", type=int, default=512, help="questions checked, in the splits' order (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the splits' seed (hotpotqa_dev --seed)")
    parser.add_argument("--engine-backend", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--engine-dtype", default="auto")
    parser.add_argument("--n-proc", type=int, default=64, help="samples in flight")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="per sample (MemAgent's: 512)")
    own, vllm_args = split_vllm_args(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(own)
    try:
        dev = read_hotpotqa(args.source or installed_source())
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"closed_book: {err}\n")
    order = split_order(dev, args.seed)
    questions = order[:args.first] if args.first > 0 else order
    prompts = write_prompts(dev, questions, args.out_dir / "prompts.jsonl")
    results = args.out_dir / "samples.jsonl"
    metrics = evaluate(args.model_path, str(prompts), "examples.mem_agent.closed_book.answered",
                       args.engine_backend, SAMPLES, args.max_new_tokens, TEMPERATURE, engine_args=vllm_args,
                       dtype=args.engine_dtype, max_model_len=args.max_new_tokens + 512, results=str(results),
                       n_proc=args.n_proc, top_p=TOP_P)
    book = tally(results, Path(args.model_path).resolve().name, SAMPLES)
    book.write(args.out_dir / "closed_book.json")
    print(json.dumps({"checked": len(book.checked), "answered": len(book.answered),
                      "share_answered": round(len(book.answered) / max(len(book.checked), 1), 3),
                      "share_of_samples_failed": metrics.get("eval/failed", 0.0)}))
    print(args.out_dir / "closed_book.json")
    exit_if_unscored(int(metrics["eval/unscored"]), "closed_book")
    return book


if __name__ == "__main__":
    main()
