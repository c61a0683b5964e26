"""Can a model make the consolidation sweep's choice when it is told the rule? For questions of a fact list split
(``prepare_data --generate-fact-lists``, or the real set), the sweep's first search (the question, ``top_k`` 20,
on the question's own store) shows 20 numbered facts; the model, asked greedily and without tools, lists the
shown facts that a later shown fact of the same slot restates, and each reply is scored against the sweep's own
answer (``sweep.restated``: what a perfect policy deletes after that search). A check of a policy's base model
before SFT is asked to learn the choice: the SFT policies of the GPU runs deleted shown facts at chance
(``docs/mem_update.md``, fact lists). Two ways of asking: ``ids`` (the superseded ids alone) and ``pairs`` (each
as "fOLD restated by fNEW", the newer fact named beside it, as ``MEMUP_RATIONALE=1``'s demonstrations name it).

    python -m examples.mem_update.choice_probe runs/mem_update_smollm2/data/val_eval.jsonl \\
        --model qwen2.5-coder-1.5b --num 32 --ask ids pairs --out runs/choice_probe

Per way of asking: precision, recall and F1 of the ids named (micro, over every question's shown facts), beside
chance (naming as many of the shown facts at random: precision = the superseded share of the shown facts) and
the share of replies that name no id. The model runs in-process (``HFEngine``: bf16 on a GPU, fp32 on a CPU).
"""

import argparse
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

from examples.mem_update.fact_consolidation import FACT_LINE
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.store import MemoryStore
from examples.mem_update.sweep import SWEEP_K, restated
from examples.mem_update.tools import ToolBox, ToolCall
from vime_ext.data.prompt_dataset import DataError, json_lines

RULE = ("Each fact below starts with its number in a list; a fact with a larger number was stated later. Two facts "
        "about the same subject and relation with different values conflict, and the later one holds: the earlier "
        "one is superseded.")
ASK = {"ids": "Name every superseded fact by its id, one id a line, and nothing else.",
       "pairs": "For every superseded fact write one line, `fOLD restated by fNEW`: its id, then the id of the "
                "later fact that restates it. Write nothing else."}
MEMORY_ID = re.compile(r"\bf\d+\b")


@dataclass(frozen=True)
class Shown:
    """One question's first sweep search: the facts shown (id, text) and the ids the sweep deletes after it."""
    question: str
    facts: list[tuple[str, str]]
    superseded: frozenset[str]


@dataclass
class Score:
    named: int = 0  # ids named that were shown (each once)
    right: int = 0  # of them superseded
    superseded: int = 0  # superseded facts shown
    shown: int = 0
    no_id: int = 0  # replies that name no shown id
    replies: int = 0
    examples: list[dict] = field(default_factory=list)

    def add(self, item: Shown, reply: str, keep: int = 3) -> None:
        ids = {fact_id for fact_id, _ in item.facts}
        # the first id of each line is the one it names as superseded (`pairs` names the newer one after it)
        named = {found[0] for line in reply.splitlines() if (found := [i for i in MEMORY_ID.findall(line) if i in ids])}
        self.named += len(named)
        self.right += len(named & item.superseded)
        self.superseded += len(item.superseded)
        self.shown += len(ids)
        self.no_id += not named
        self.replies += 1
        if len(self.examples) < keep:
            self.examples.append({"question": item.question, "superseded": sorted(item.superseded),
                                  "reply": reply[:600]})

    def row(self) -> dict:
        precision = self.right / self.named if self.named else 0.0
        recall = self.right / self.superseded if self.superseded else 0.0
        return {"replies": self.replies, "precision": round(precision, 3), "recall": round(recall, 3),
                "f1": round(2 * precision * recall / (precision + recall), 3) if precision + recall else 0.0,
                "named_a_reply": round(self.named / max(self.replies, 1), 2),
                "superseded_a_reply": round(self.superseded / max(self.replies, 1), 2),
                "chance_precision": round(self.superseded / self.shown, 3) if self.shown else 0.0,
                "no_id": self.no_id}


def shown_items(path: str | Path, num: int, retriever: str = "embedding", seed: int = 0) -> list[Shown]:
    """``num`` questions of a fact list split (drawn with ``seed``, in file order), each with its first sweep
    search on its own store; a record without numbered fact memories is refused with its file and line."""
    rows = list(json_lines(path))
    picked = sorted(random.Random(seed).sample(range(len(rows)), min(num, len(rows))))
    store, search, items = MemoryStore(), make_retriever(retriever), []
    for index in picked:
        where, record = rows[index]
        memories = (record.get("metadata") or {}).get("memories") or []
        if not any(FACT_LINE.fullmatch(str(m.get("content", "")).strip()) for m in memories):
            raise DataError(f"{where}: no numbered fact among its memories (a fact list split is needed)")
        namespace = store.create(memories)
        try:
            results = ToolBox(namespace, search).run(
                ToolCall("search_memory", {"query": str(record["prompt"]), "top_k": SWEEP_K})).content["results"]
        finally:
            store.drop(namespace.name)
        items.append(Shown(str(record["prompt"]), [(hit["id"], str(hit["content"])) for hit in results],
                           frozenset(older for older, _ in restated(results))))
    return items


def prompt(tokenizer, item: Shown, ask: str) -> list[int]:
    facts = "\n".join(f"{fact_id}: {text}" for fact_id, text in item.facts)
    messages = [{"role": "system", "content": RULE},
                {"role": "user", "content": f"{facts}\n\n{ASK[ask]}"}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


def probe(items: list[Shown], model: str, asks: list[str], batch: int = 16,
          max_new_tokens: int = 256) -> dict[str, Score]:
    import torch

    from examples.mem_update.headroom import reader_replies
    from vime_ext.engines.hf_engine import HFEngine

    engine = HFEngine(model, dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32,
                      max_batch_size=batch)
    scores = {}
    for ask in asks:
        scores[ask] = Score()
        replies = reader_replies(engine, [prompt(engine.tokenizer, item, ask) for item in items], max_new_tokens)
        for item, reply in zip(items, replies):
            scores[ask].add(item, reply)
    return scores


def table(scores: dict[str, Score], model: str) -> str:
    lines = [f"Model {model}; the first sweep search's 20 facts a question.", "",
             "| asked for | replies | precision | recall | F1 | ids named a reply | superseded shown a reply | "
             "chance precision | replies without an id |", "|---|---|---|---|---|---|---|---|---|"]
    for ask, score in scores.items():
        row = score.row()
        lines.append(f"| {ask} | {row['replies']} | {row['precision']:.3f} | {row['recall']:.3f} | {row['f1']:.3f} | "
                     f"{row['named_a_reply']} | {row['superseded_a_reply']} | {row['chance_precision']:.3f} | "
                     f"{row['no_id']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict[str, Score]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="a fact list split (JSONL prompt records with their memories)")
    parser.add_argument("--model", required=True, help="an HF folder or a packaged model's name")
    parser.add_argument("--num", type=int, default=32, help="questions drawn from the split (default 32)")
    parser.add_argument("--ask", nargs="+", choices=sorted(ASK), default=sorted(ASK))
    parser.add_argument("--retriever", default="embedding", choices=["embedding", "bm25"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="a reply's bound (default 256: 20 pairs)")
    parser.add_argument("--out", default=None, help="OUT.md (the table) and OUT.json (figures and examples)")
    args = parser.parse_args(argv)
    model = args.model
    if not Path(model).is_dir():
        from vime_ext.models.packaged import model_folder
        model = str(model_folder(model))
    scores = probe(shown_items(args.data, args.num, args.retriever), model, args.ask, args.batch, args.max_new_tokens)
    text = table(scores, args.model)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.md").write_text(text)
        Path(f"{args.out}.json").write_text(json.dumps(
            {"model": args.model, "data": str(args.data),
             "asks": {ask: {**score.row(), "examples": score.examples} for ask, score in scores.items()}}, indent=1))
    return scores


if __name__ == "__main__":
    main()
