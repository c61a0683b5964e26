"""RULER-HQA evaluation of a served model with the MemAgent loop, one length at a time.

    python -m examples.mem_agent.eval_ruler_hqa --model-path HF_DIR --data-root DIR --length 50 200 800 \
        --save-dir results --save-file my_model [--n-proc 16] [--temperature 0.7] [--top-p 0.95] [--force]
        [--custom-config-path mem.yaml] [--engine-backend vllm|hf] [--tp 1] [--num-engines 1] [--max-model-len N]
        [--model-url URL]
        [--lengths-at-once [--at-once-max-docs N]]
        [--vllm-X ...: any vLLM server flag --X, for the engine this starts]

For each N (one after the other, or with ``--lengths-at-once`` all at the same time) it reads ``DATA_ROOT/eval_{N}.json`` and writes ``SAVE_DIR/ruler_hqa_{N}/{SAVE_FILE}.jsonl`` (one line
per item: ``_id``, ``answer`` (gold), ``pred``, ``judge_f1``, ``judge_em``, ``judge_sub_em``, ``response``, the
document's ``doc_tokens`` and ``chunks``, the final ``memory`` the answer was read from, ``answer_trace`` (a
character per chunk: 1 when the memory after it held a gold answer), the item's ``seconds``, and its other keys
except ``context``) and
``{SAVE_FILE}.summary.json`` (f1/em/sub_em x100 over the scored items, the counts of failed and refused items,
the cost per item: mean document tokens, chunks, seconds and document tokens read per second; and this run's wall
time, items scored and document tokens read per second of wall time, all items together). Resumable: items
already in the output are skipped; a line cut by a kill is dropped and its item run again; an item a kill stopped
mid-document goes on from the last chunk it finished (its chunk and memory are kept in
``{SAVE_FILE}.progress.jsonl`` while it runs; its row says ``resumed_at``, and its time is left out of the cost
figures). Items the engine failed on twice are listed in ``{SAVE_FILE}.failed.jsonl``, retried by the next run
and never scored as 0; the command then exits with status 3 after every length's summary. At the end,
``SAVE_DIR/ruler_hqa_sub_em.png`` plots sub-EM against the number of documents for every ``SAVE_FILE`` found in
``SAVE_DIR``.

The engine is started for ``--model-path`` (and stopped at the end) unless ``--model-url`` names a running one.
The document is read whole unless ``mem_eval_max_chunks`` is set; every cut is logged with its size.
"""

import argparse
import asyncio
import copy
import json
import sys
import time
from pathlib import Path

from examples.mem_agent.data import read_eval_file
from examples.mem_agent.rollout import MemSettings, generate
from examples.mem_agent.scoring import exact_match, extract_answer, substring_match
from vime_ext.agent.rewards import token_f1 as f1
from vime_ext.agent.sample import Sample
from vime_ext.engines.protocol import SamplingParams
from vime_ext.evaluate import evaluate_items, exit_if_unscored, served
from vime_ext.rollout.plugins import load_custom_config, plugin_args

JUDGES = ("judge_f1", "judge_em", "judge_sub_em")


def score_row(item, entry: dict, response: str, answer_format: str) -> dict:
    gold = item.answers[0]
    pred = extract_answer(response, answer_format) or ""
    row = {k: v for k, v in entry.items() if k != "context"}
    row.update(_id=str(item.index), answer=gold, pred=pred, response=response,
               judge_f1=f1(pred, gold), judge_em=exact_match(pred, gold), judge_sub_em=substring_match(pred, gold))
    return row


def summarize(rows: list[dict], failed: int, refused: int, num_docs: int, save_file: str,
              n_proc: int | None) -> dict:
    """The scores x 100 over the scored items, and what an item cost: its document's tokens and chunks, its
    seconds (generate and score, ``n_proc`` items in flight) and the document tokens it read per second (means
    over the rows that have them and were read in one run: rows of earlier versions lack them)."""
    n = len(rows)
    summary = {"save_file": save_file, "num_docs": num_docs, "scored": n, "failed": failed, "refused": refused}
    for judge in JUDGES:
        summary[judge.removeprefix("judge_")] = round(100 * sum(r[judge] for r in rows) / n, 2) if n else None
    # An item resumed mid-document (an earlier run stopped in it) timed only its rest: left out of the cost.
    timed = [r for r in rows if r.get("seconds") and r.get("doc_tokens") and not r.get("resumed_at")]
    summary["resumed"] = sum(1 for r in rows if r.get("resumed_at"))
    if timed:
        summary.update(n_proc=n_proc, doc_tokens=round(sum(r["doc_tokens"] for r in timed) / len(timed), 1),
                       chunks=round(sum(r["chunks"] for r in timed) / len(timed), 2),
                       seconds_per_item=round(sum(r["seconds"] for r in timed) / len(timed), 3),
                       doc_tokens_per_s=round(sum(r["doc_tokens"] / r["seconds"] for r in timed) / len(timed), 1))
    return summary


async def evaluate_length(args, url: str, data_file: Path, out_dir: Path, save_file: str, n_proc: int,
                          params: SamplingParams, force: bool, lengths_at_once: int = 1) -> dict:
    """One length's file through the framework's evaluation loop (resumable, failures kept apart), then its
    summary (``lengths_at_once``: how many lengths shared the engine meanwhile, for its cost figures)."""
    items, refused = read_eval_file(data_file)
    for message in refused:
        print(f"refused: {message}", file=sys.stderr)
    settings = MemSettings.from_args(args)
    entries = {str(item.index): (item, entry) for item, entry in items}
    slots = [(str(item.index), Sample(prompt=item.question, label=item.answers, index=i,
                                      metadata={"context": item.context, "source": f"{data_file}:{item.index}"}))
             for i, (item, _) in enumerate(items)]

    async def scored(item_id: str, sample: Sample) -> dict:
        item, entry = entries[item_id]
        return {**score_row(item, entry, sample.response, settings.answer_format),
                **{key: sample.metadata.get(key, 0) for key in ("tokens_cut", "doc_tokens", "chunks", "resumed_at")},
                "memory": sample.metadata.get("memory", ""), "answer_trace": sample.metadata.get("answer_trace", "")}

    start = time.perf_counter()
    done = await evaluate_items(args, url, slots, generate, scored, params, out_dir / f"{save_file}.jsonl",
                                n_proc, force, desc=data_file.name)
    wall = time.perf_counter() - start
    num_docs = items[0][0].num_docs if items else 0
    summary = summarize(list(done.rows.values()), len(done.failed), len(refused), num_docs, save_file, n_proc)
    # The throughput of this run: the document tokens its items read (a resumed item's rest only) over its wall
    # time, with every item in flight and (lengths_at_once) the other lengths beside it.
    new = [done.rows[item_id] for item_id in done.scored_now]
    read = sum(r["doc_tokens"] * (1 - r.get("resumed_at", 0) / r["chunks"]) for r in new if r.get("chunks"))
    summary.update(lengths_at_once=lengths_at_once, wall_s=round(wall, 1), scored_this_run=len(new),
                   read_tokens_per_s=round(read / wall, 1) if new and wall > 0 else None)
    (out_dir / f"{save_file}.summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# The reference files of the real benchmark (examples/mem_agent/hotpotqa_dev.py), by their number of documents:
# what the row is called and how its level is drawn
REFERENCES = {0: ("no document", "--"), 2: ("gold pair", ":")}


def plot(save_dir: Path) -> Path | None:
    """sub-EM against the number of documents, one line per SAVE_FILE found under ``save_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(save_dir.glob("ruler_hqa_*/*.summary.json")):
        s = json.loads(path.read_text())
        if s.get("sub_em") is not None:
            curves.setdefault(s["save_file"], []).append((int(s["num_docs"]), float(s["sub_em"])))
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, points in sorted(curves.items()):
        points.sort()
        lengths = [(n, v) for n, v in points if n not in REFERENCES]
        line, = ax.plot([n for n, _ in lengths], [v for _, v in lengths], marker="o", label=name)
        # the reference files are levels, not lengths
        for n, level in points:
            if n in REFERENCES:
                ax.axhline(level, color=line.get_color(), linestyle=REFERENCES[n][1],
                           label=f"{name}, {REFERENCES[n][0]}")
    path = save_dir / "ruler_hqa_sub_em.png"
    save_sub_em_figure(fig, ax, "documents per question (RULER-HQA length)", path)
    return path


def save_sub_em_figure(fig, ax, xlabel: str, path: Path) -> None:
    """The axes of a sub-EM against length plot (length on a log-2 scale, sub-EM 0-100), saved to ``path``."""
    import matplotlib.pyplot as plt

    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("sub-EM (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description="RULER-HQA evaluation with the MemAgent loop (sub-EM, EM, F1)")
    parser.add_argument("--model-path", required=True, help="HF directory of the model (its tokenizer chunks the text)")
    parser.add_argument("--model-url", default=None, help="a running engine or router; default: start one")
    parser.add_argument("--data-root", required=True, help="folder with eval_{N}.json files")
    parser.add_argument("--length", nargs="+", type=int, required=True, help="numbers of documents N to run")
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--save-file", default=None, help="output name (default: the model folder's name)")
    parser.add_argument("--n-proc", type=int, default=16, help="items in flight at once (per length)")
    parser.add_argument("--lengths-at-once", action="store_true",
                        help="run every length at the same time (a length's items stay within --n-proc): the "
                             "whole evaluation takes about as long as its longest length alone")
    parser.add_argument("--at-once-max-docs", type=int, default=None,
                        help="with --lengths-at-once: only lengths of at most this many documents at once, the "
                             "longer ones after them one at a time, shortest first (on the same engine), so that "
                             "a run cut short has finished every length before the one it was in")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--force", action="store_true", help="score every item again")
    parser.add_argument("--custom-config-path", default=None, help="mem_* settings (YAML or JSON)")
    parser.add_argument("--engine-backend", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--engine-dtype", default="auto")
    parser.add_argument("--tp", type=int, default=1, help="tensor parallel size of the vLLM engine")
    parser.add_argument("--num-engines", type=int, default=1,
                        help="data-parallel engines, each on --tp GPUs of its own, behind vllm-router")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (transformers engine or GPU vLLM)")
    from vime_ext.engines.servers import EngineConfig, split_vllm_args

    own, vllm_args = split_vllm_args(sys.argv[1:] if argv is None else list(argv))  # --vllm-X: the engine's --X
    options = parser.parse_args(own)
    from transformers import AutoTokenizer

    custom = load_custom_config(options.custom_config_path, set()) if options.custom_config_path else {}
    args = plugin_args([], custom)
    args.tokenizer = AutoTokenizer.from_pretrained(options.model_path)
    MemSettings.from_args(args)  # settings errors before any engine starts
    data_root, save_dir = Path(options.data_root), Path(options.save_dir)
    missing = [n for n in options.length if not (data_root / f"eval_{n}.json").is_file()]
    if missing:
        parser.error(f"no eval files for lengths {missing} in {data_root} (see prepare-eval-data.sh)")
    save_file = options.save_file or Path(options.model_path).resolve().name
    params = SamplingParams(temperature=options.temperature, top_p=options.top_p, max_new_tokens=1,
                            seed=options.seed, log_probs=False)  # scored answers need no log-probs
    extra = ["--tensor-parallel-size", str(options.tp)] if options.engine_backend == "vllm" and options.tp > 1 \
        else []
    engine = EngineConfig(options.model_path, backend=options.engine_backend, dtype=options.engine_dtype,
                          max_model_len=options.max_model_len, extra_args=extra + vllm_args, rl_routes=False)

    async def one_length(n: int, sharing: int) -> dict:
        # Each length its own copy of the plug-in args: the loop sets the engine client on the args it is given.
        summary = await evaluate_length(copy.copy(args), url, data_root / f"eval_{n}.json",
                                        save_dir / f"ruler_hqa_{n}", save_file, options.n_proc, params, options.force,
                                        sharing)
        print(json.dumps(summary))
        return summary

    async def every_length() -> list[dict]:
        if not options.lengths_at_once:
            return [await one_length(n, 1) for n in options.length]
        cap = options.at_once_max_docs
        together = [n for n in options.length if cap is None or n <= cap]
        summaries = list(await asyncio.gather(*(one_length(n, len(together)) for n in together)))
        return summaries + [await one_length(n, 1) for n in sorted(set(options.length) - set(together))]

    with served(engine, options.model_url, engines=options.num_engines) as url:
        summaries = asyncio.run(every_length())
    figure = plot(save_dir)
    if figure:
        print(f"plot: {figure}")
    exit_if_unscored(sum(summary["failed"] for summary in summaries), "eval_ruler_hqa")
    return summaries


if __name__ == "__main__":
    main()
