"""QA on held-out conversations before and after the agent's edits.

    python -m examples.mem_update.eval_mem_update --model-path DIR --test-data test.jsonl --save-dir results \
        [--save-file NAME ...] [--edit agent|noop|oracle|demonstrated|consolidated|swept ...] [--reader-model DIR
        [--reader-replies-file F]]
        [--engine-backend vllm|hf] [--engine-dtype float32] [--force] [--vllm-X ...]

Each test prompt is one episode of the served model on its conversation's initial memories (greedy by default;
``--edit noop|oracle|demonstrated|consolidated|swept``: the store left alone, given each scored question's gold
answer, edited as SFT's demonstrations do, or, on fact consolidation data, every superseded fact deleted or those
that a consolidation sweep's searches show, in the model's place; several edits: a row each, on the same engines),
scored by the training reward: the QA score of the store before and after, with the settings of
``--custom-config-path``. Writes ``SAVE_DIR/SAVE_FILE.json`` (qa_before, qa_after, the delta, reward, per LoCoMo
category, tool calls and errors per episode, failed episodes) and prints it. Each finished episode goes to
``SAVE_DIR/SAVE_FILE.samples.jsonl`` as it ends, so a second run goes on where a killed one stopped (``--force``:
all again); an episode that fails twice is listed in ``SAVE_FILE.samples.failed.jsonl`` and run again next
time, and the command then exits with status 3 after writing the summaries.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from examples.mem_update.locomo import CATEGORIES
from examples.mem_update.tools import ERROR_KINDS, TOOLS
from vime_ext.engines.servers import EngineConfig, in_memory_share, split_vllm_args
from vime_ext.evaluate import EvalRow, evaluate_rows, exit_if_unscored

HERE = Path(__file__).resolve().parent
TOOL_NAMES = [tool["function"]["name"] for tool in TOOLS]
EDITS = {"agent": "examples.mem_update.rollout.generate", "noop": "examples.mem_update.baselines.noop",
         "oracle": "examples.mem_update.baselines.oracle", "demonstrated": "examples.mem_update.baselines.demonstrated",
         "consolidated": "examples.mem_update.baselines.consolidated", "swept": "examples.mem_update.baselines.swept"}


def summarize(metrics: dict[str, float]) -> dict:
    """The evaluation's figures, named for a reader."""
    get = lambda name: metrics.get(f"eval/{name}")  # noqa: E731
    summary = {"episodes": int(metrics["eval/samples"]), "qa_before": get("qa_before"), "qa_after": get("qa_after"),
               "qa_delta": None if get("qa_after") is None else get("qa_after") - get("qa_before"),
               "reward": metrics["eval/reward_mean"], "failed": metrics["eval/failed"],
               "unfinished": get("unfinished"), "tool_calls": get("tool_calls"), "tool_errors": get("tool_errors"),
               "valid_tool_calls": get("valid_tool_calls"), "store_edits": get("store_edits"),
               "initial_memory_count": get("initial_memory_count"), "final_memory_count": get("final_memory_count"),
               "initial_memory_chars": get("initial_memory_chars"), "final_memory_chars": get("final_memory_chars"),
               "calls_per_tool": {name: get(f"calls_{name}") for name in TOOL_NAMES
                                  if get(f"calls_{name}") is not None},
               "errors_per_kind": {kind: get(f"errors_{kind}") for kind in ERROR_KINDS
                                   if get(f"errors_{kind}") is not None}}
    for group in ("seen", "unseen"):  # the question the agent was shown, and the conversation's others
        before, after = get(f"qa_before_{group}"), get(f"qa_after_{group}")
        summary[f"qa_delta_{group}"] = None if before is None or after is None else after - before
    summary["categories"] = {name: {"qa_before": get(f"{name}_qa_before"), "qa_after": get(f"{name}_qa_after")}
                             for name in CATEGORIES.values() if get(f"{name}_qa_before") is not None}
    return summary


def reader_config(args: argparse.Namespace, vllm_args: list[str], gpu: bool) -> EngineConfig:
    """The evaluation's reader, as train.py's --rm-hf-checkpoint engine: the model engine's --vllm-* flags (a fixed
    KV cache, eager mode) in a memory share of its own (--reader-memory), without the weight-update routes."""
    return EngineConfig(args.reader_model, backend=args.engine_backend, dtype=args.engine_dtype,
                        max_model_len=args.max_model_len, rl_routes=False,
                        extra_args=in_memory_share(vllm_args, args.reader_memory if gpu else None))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", required=True, help="HF checkpoint to serve")
    parser.add_argument("--test-data", required=True, help="test.jsonl of prepare_data.py")
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--save-file", nargs="+", default=None,
                        help="result name, one per --edit (default: the model folder's name for agent, the edit's "
                             "name for the others)")
    parser.add_argument("--engine-backend", choices=["vllm", "hf"], default="vllm")
    parser.add_argument("--engine-dtype", default="auto")
    parser.add_argument("--max-response-len", type=int, default=256, help="new tokens per reply")
    parser.add_argument("--max-model-len", type=int, default=None, help="the engine's context length")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--custom-config-path", default=str(HERE / "mem_update.yaml"))
    parser.add_argument("--force", action="store_true", help="run every episode again")
    parser.add_argument("--reader-model", default=None,
                        help="score QA with this model as the reader (an engine of its own, the same for every "
                             "model evaluated) instead of the settings' scorer")
    parser.add_argument("--edit", nargs="+", choices=sorted(EDITS), default=["agent"],
                        help="who edits the store: the served model (agent), nobody (noop: doing nothing), the "
                             "oracle (each scored question's gold answer added: the ceiling), or SFT's demonstrated "
                             "episode (demonstrated: what perfect imitation scores), every superseded fact deleted "
                             "(consolidated) or those a sweep's searches show (swept; both fact consolidation data "
                             "only); baselines.py. Several: "
                             "one row each, in turn, on the same engines (one start; the reader's reply to a "
                             "prompt is the same in every row)")
    parser.add_argument("--reader-replies-file", default=None,
                        help="with --reader-model: a file the reader's greedy replies are kept in for every run that "
                             "names it (train.py's --rm-replies-file), so that rows and seeds evaluated in separate "
                             "runs score an unchanged store the same")
    parser.add_argument("--reader-memory", type=float, default=0.15,
                        help="the reader engine's share of GPU memory (vLLM on a GPU)")
    parser.add_argument("--num-engines", type=int, default=1,
                        help="data-parallel engines of the model, each on GPUs of its own, behind vllm-router (the "
                             "reader, one engine, on the first GPU)")
    own, vllm_args = split_vllm_args(sys.argv[1:] if argv is None else list(argv))
    args = parser.parse_args(own)
    names = args.save_file or [Path(args.model_path).name if edit == "agent" else edit for edit in args.edit]
    if len(names) != len(args.edit):
        parser.error(f"--save-file names {len(names)} file(s) for {len(args.edit)} --edit row(s): one each")
    reader, override = None, {}
    if args.reader_model:
        reader = reader_config(args, vllm_args, args.engine_backend == "vllm" and torch.cuda.is_available())
        override = {"memup_scorer": "reader"}
    rows = [EvalRow(EDITS[edit], str(Path(args.save_dir) / f"{name}.samples.jsonl"))
            for edit, name in zip(args.edit, names)]
    every = evaluate_rows(args.model_path, args.test_data, "examples.mem_update.reward.reward", args.engine_backend,
                          1, args.max_response_len, args.temperature, engine_args=vllm_args,
                          custom_config_path=args.custom_config_path, dtype=args.engine_dtype,
                          max_model_len=args.max_model_len, force=args.force,
                          settings_override=override, reward_model=reader, engines=args.num_engines, rows=rows,
                          reward_replies_file=args.reader_replies_file if args.reader_model else None)
    summaries = []
    for edit, name, metrics in zip(args.edit, names, every):
        summary = {"model": args.model_path, "edit": edit, "test_data": args.test_data,
                   "scorer": f"reader {args.reader_model}" if args.reader_model else "from the settings",
                   **summarize(metrics)}
        out = Path(args.save_dir) / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary, indent=1))
        summaries.append(summary)
    exit_if_unscored(sum(int(metrics["eval/unscored"]) for metrics in every), "eval_mem_update")
    return summaries


if __name__ == "__main__":
    main()
