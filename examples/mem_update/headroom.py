"""What the untouched store leaves a MemUpdate editor to gain, read from prepared data before any model runs:

    python -m examples.mem_update.headroom runs/mem_update_smollm2/data/val_eval.jsonl [--retriever embedding] \
        [--top-k 5] [--extra-questions 3] [--reader DIR [--batch 16]] [--out headroom]

For the question each episode shows the agent and for the unseen ones the evaluation also scores
(``extra_qa``, the first ``--extra-questions``), on the store as prepared:

- how many have all their evidence (the dialogue turns the answer comes from) in the search's top k, the memories
  the reader is given: an edit can only add to what the reader sees where some is missing;
- how many memories of that top k come from turns no question of the conversation names (noise to the
  demonstrations, which delete it), and how many top k hold at least one;
- how many unseen questions share evidence with the shown one: an edit made for the shown question reaches an
  unseen one directly only through those; the rest it reaches only through what it deletes or adds beside them.

With ``--reader`` (an HF model folder or a packaged model's name: the evaluation's fixed reader), also what the
reader makes of the untouched store: its greedy reply to every question, from the same prompt the reward builds
(``reward.reader_prompt``) and scored as the reward scores it (``reward.reply_f1``), by question kind and LoCoMo
category; and of the replies that miss (F1 below 1), how many hold every token of the answer and say more (the
reader knew it: a longer reply), how many say only part of it (a shorter reply, such as a bare "Yes" against
"Yes, Kofi plays the flute", which token F1 scores 0), and the rest (another answer). Misses of the first two
kinds are the answer's form, not the store's content. Greedy, on the in-process transformers engine
(``HFEngine``; bf16 on a GPU, fp32 on a CPU: the vLLM engines' bf16 replies can differ in a few questions); the
first misses of each kind are kept in OUT.json.

The data must come from ``prepare_data.py`` as it is now (each unseen question with its ``evidence``); older files
are refused with the line named. Printed as a table; with ``--out``, OUT.md and OUT.json too.
"""

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

from examples.mem_update.locomo import CATEGORIES
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.reward import answer_line, reader_prompt, reply_f1
from examples.mem_update.settings import MemUpdateSettings
from examples.mem_update.store import Memory
from vime_ext.agent.rewards import normalize_text
from vime_ext.data.prompt_dataset import DataError, json_lines
from vime_ext.reports import report

EXAMPLES_KEPT = 3  # misses of each kind kept in OUT.json, per row


@dataclass
class Headroom:
    questions: int = 0
    evidence_in_top: int = 0  # all of the question's evidence among the top k memories
    noise_in_top: int = 0  # memories of the top k from turns no question of the conversation names, summed
    tops_with_noise: int = 0
    shares_evidence: int = 0  # unseen questions whose evidence overlaps the shown question's

    def add(self, evidence: set[str], top: list[Memory], asked: set[str]) -> None:
        turns = [set(m.metadata.get("evidence", [])) for m in top]
        self.questions += 1
        self.evidence_in_top += evidence <= set().union(*turns)
        noise = sum(not (t & asked) for t in turns)
        self.noise_in_top += noise
        self.tops_with_noise += noise > 0


@dataclass
class Ask:
    """One scored question on the untouched store: what the reader is asked, from which memories."""
    group: str  # shown or unseen
    category: str
    question: str
    answer: str
    top: list[Memory]


def miss_kind(reply: str, answer: str) -> str:
    """How a reply that misses relates to the answer, token sets after normalising: "longer" (every answer token
    in the reply, and more), "shorter" (every reply token in the answer, not all of it), "other"."""
    got, want = set(normalize_text(answer_line(reply)).split()), set(normalize_text(answer).split())
    if want and want <= got:
        return "longer"
    if got and got <= want:
        return "shorter"
    return "other"


@dataclass
class ReaderRow:
    questions: int = 0
    f1: float = 0.0  # summed; the table shows the mean
    misses: int = 0
    kinds: dict[str, int] = field(default_factory=lambda: {"longer": 0, "shorter": 0, "other": 0})
    examples: list[dict] = field(default_factory=list)

    def add(self, ask: Ask, reply: str) -> None:
        score = reply_f1(reply, ask.answer)
        self.questions += 1
        self.f1 += score
        if score < 1.0:
            self.misses += 1
            kind = miss_kind(reply, ask.answer)
            self.kinds[kind] += 1
            if sum(e["kind"] == kind for e in self.examples) < EXAMPLES_KEPT:
                self.examples.append({"kind": kind, "question": ask.question, "answer": ask.answer,
                                      "reply": answer_line(reply), "f1": round(score, 3)})


def reader_replies(engine, prompts: list[list[int]], max_new_tokens: int = 32) -> list[str]:
    """The reader's greedy replies to token-id prompts, from an in-process ``HFEngine`` (its batched generation,
    ``max_batch_size`` prompts at a time), decoded as the reward decodes them."""
    from tqdm import tqdm

    from vime_ext.engines.protocol import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, log_probs=False)
    replies = []
    for start in tqdm(range(0, len(prompts), engine.max_batch_size), desc="reader", unit="batch"):
        results = engine.generate_batch(prompts[start:start + engine.max_batch_size], params)
        replies += [engine.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in results]
    return replies


def reader_rows(asks: list[Ask], model: str, batch: int = 16) -> dict[str, ReaderRow]:
    """The reader's scores on the untouched store, per question kind and category ("unseen temporal", ...); the
    model in bf16 on a GPU, fp32 on a CPU."""
    import torch

    from vime_ext.engines.hf_engine import HFEngine

    engine = HFEngine(model, dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32,
                      max_batch_size=batch)
    args, settings = SimpleNamespace(tokenizer=engine.tokenizer), MemUpdateSettings()
    prompts = [reader_prompt(args, settings, a.question, a.top)[1] for a in asks]
    rows: dict[str, ReaderRow] = {}
    for ask, reply in zip(asks, reader_replies(engine, prompts, settings.reader_max_tokens)):
        rows.setdefault(f"{ask.group} {ask.category}", ReaderRow()).add(ask, reply)
    return dict(sorted(rows.items()))


def reader_table(rows: dict[str, ReaderRow]) -> str:
    lines = ["| questions | scored | F1 (mean) | missed (F1 < 1) | of them: longer / shorter / other |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r.questions} | {r.f1 / r.questions:.3f} | {r.misses} | "
                     f"{r.kinds['longer']} / {r.kinds['shorter']} / {r.kinds['other']} |")
    return "\n".join(lines)


def _field(row: dict, key: str, where: str):
    if key not in row:
        raise DataError(f"{where}: no {key!r}; prepare the data again (examples/mem_update/prepare_data.py)")
    return row[key]


def headroom(path: Path, retriever: str = "embedding", top_k: int = 5,
             extra_questions: int = 3) -> tuple[dict[str, Headroom], list[Ask]]:
    """The shown and the unseen questions' figures over every episode of a prepared data file, and each scored
    question with its top k (what the reader would be asked)."""
    search = make_retriever(retriever)
    shown, unseen = Headroom(), Headroom()
    asks = []
    for where, row in json_lines(path):
        meta = _field(row, "metadata", where)
        memories = [Memory.from_record(r, i) for i, r in enumerate(_field(meta, "memories", where))]
        asked = set(_field(meta, "asked_evidence", where))
        evidence = set(_field(meta, "evidence", where))
        questions = [(shown, "shown", meta.get("category"), str(row.get("prompt", "")), row.get("label"), evidence)]
        for extra in _field(meta, "extra_qa", where)[:extra_questions]:
            other = set(_field(extra, "evidence", f"{where} (extra_qa)"))
            unseen.shares_evidence += bool(other & evidence)
            questions.append((unseen, "unseen", extra.get("category"), str(extra["question"]),
                              _field(extra, "answer", f"{where} (extra_qa)"), other))
        for counts, group, category, question, answer, needs in questions:
            top = [m for m, _ in search.search(question, memories, top_k=top_k)]
            counts.add(needs, top, asked)
            asks.append(Ask(group, CATEGORIES.get(category, "unknown"), question, str(answer), top))
    return {"shown": shown, "unseen": unseen}, asks


def table(rows: dict[str, Headroom], top_k: int) -> str:
    lines = [f"| questions | scored | all evidence in the top {top_k} | noise memories a top {top_k} (mean) | "
             f"a top {top_k} with noise | sharing evidence with the shown question |", "|---|---|---|---|---|---|"]
    for name, h in rows.items():
        mean = h.noise_in_top / h.questions if h.questions else 0.0
        sharing = "-" if name == "shown" else f"{h.shares_evidence} of {h.questions}"
        lines.append(f"| {name} | {h.questions} | {h.evidence_in_top} of {h.questions} | {mean:.2f} | "
                     f"{h.tops_with_noise} of {h.questions} | {sharing} |")
    return "\n".join(lines)


def main(argv=None) -> dict[str, Headroom]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="a prepared split (prepare_data.py), e.g. data/val_eval.jsonl")
    parser.add_argument("--retriever", default="embedding", help="embedding or bm25 (memup_retriever)")
    parser.add_argument("--top-k", type=int, default=5, help="memories the reader is given (memup_top_k)")
    parser.add_argument("--extra-questions", type=int, default=3,
                        help="unseen questions scored (memup_extra_questions)")
    parser.add_argument("--reader", help="also the reader's replies on the untouched store: an HF model folder or a "
                                         "packaged model's name (qwen2.5-coder-1.5b, the recipe's reader)")
    parser.add_argument("--batch", type=int, default=16, help="the reader's prompts a batch")
    parser.add_argument("--out", type=Path, help="also write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    rows, asks = headroom(args.data, args.retriever, args.top_k, args.extra_questions)
    text, figures = table(rows, args.top_k), {k: asdict(v) for k, v in rows.items()}
    if args.reader:
        from vime_ext.models.packaged import model_folder

        read = reader_rows(asks, model_folder(args.reader), args.batch)
        text += "\n\nThe reader on the untouched store:\n\n" + reader_table(read)
        figures["reader"] = {k: asdict(v) for k, v in read.items()}
    report(text, figures, args.out)
    return figures


if __name__ == "__main__":
    main()
