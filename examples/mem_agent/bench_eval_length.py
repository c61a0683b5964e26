"""Benchmark (not a test): MemAgent evaluation time per item against document length. The loop reads a
document chunk by chunk with a fixed-size memory, so its cost should grow linearly with the number of
documents; this measures it on generated RULER-HQA-format files and fits a line.

    python -m examples.mem_agent.bench_eval_length --model-path HF_DIR [--lengths 4 8 16 32] [--items 8]
        [--engine-backend hf vllm] [--engine-dtype float32] [--chunk-tokens 256] [--max-memory 32]
        [--max-final 16] [--out bench.json]

Prints, per engine backend and length: documents, document tokens, chunks, seconds per item; then per backend
the linear fit of seconds per item on the number of documents (slope, intercept, R^2) and the marginal cost per
added document between the two longest lengths over that between the two shortest, which is about 1 when the
growth is linear (above 1: faster than linear). With two backends it also prints, per length, how many times
longer the first takes than the second (the same items, engine after engine, in one run).
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> dict:
    """Figures per backend (and the slowdown of the first over the second, with two)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--n-proc", type=int, default=8)
    parser.add_argument("--engine-backend", choices=["hf", "vllm"], nargs="+", default=["hf"])
    parser.add_argument("--engine-dtype", default="float32")
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--max-memory", type=int, default=32)
    parser.add_argument("--max-final", type=int, default=16)
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    if len(set(args.engine_backend)) != len(args.engine_backend) or len(args.engine_backend) > 2:
        parser.error("--engine-backend: one backend, or two different ones to compare")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    work = Path(tempfile.mkdtemp(prefix="mem_bench_"))
    (work / "mem.json").write_text(json.dumps({"mem_chunk_tokens": args.chunk_tokens,
                                               "mem_max_memory": args.max_memory, "mem_max_final": args.max_final}))
    results = {backend: bench_backend(args, backend, tokenizer, work) for backend in args.engine_backend}
    if len(args.engine_backend) == 2:
        first, second = (results[b]["rows"] for b in args.engine_backend)
        results["slowdown_first_over_second"] = {
            r1["documents"]: r1["seconds_per_item"] / r2["seconds_per_item"] for r1, r2 in zip(first, second)}
        print(json.dumps({"slowdown": f"{args.engine_backend[0]} / {args.engine_backend[1]}",
                          **results["slowdown_first_over_second"]}))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return results


def bench_backend(args, backend: str, tokenizer, work: Path) -> dict:
    from examples.mem_agent.data import write_eval_file
    from examples.mem_agent.eval_ruler_hqa import main as run_eval
    from vime_ext.engines.servers import EngineConfig, launch_engine, wait_until_serving

    vllm = backend == "vllm"
    engine = launch_engine(EngineConfig(args.model_path, backend=backend, dtype=args.engine_dtype,
                                        max_model_len=4096 if vllm else None,
                                        extra_args=["--enforce-eager"] if vllm else [], rl_routes=False))
    rows = []
    try:
        wait_until_serving([engine], timeout_s=900)
        for n in args.lengths:
            path = write_eval_file(work / "data", n, args.items, seed=7)
            doc_tokens = np.mean([len(tokenizer(e["context"], add_special_tokens=False)["input_ids"])
                                  for e in json.loads(path.read_text())])
            start = time.perf_counter()
            run_eval(["--model-path", args.model_path, "--model-url", engine.url, "--data-root", str(work / "data"),
                      "--length", str(n), "--save-dir", str(work / "out"), "--save-file", f"bench_{backend}",
                      "--n-proc", str(args.n_proc), "--custom-config-path", str(work / "mem.json"),
                      "--temperature", "0.7", "--force"])
            seconds = (time.perf_counter() - start) / args.items
            rows.append({"engine": backend, "documents": n, "document_tokens": float(doc_tokens),
                         "chunks": int(np.ceil(doc_tokens / args.chunk_tokens)), "seconds_per_item": seconds})
            print(json.dumps(rows[-1]))
    finally:
        engine.stop()
    x = np.array([r["documents"] for r in rows], dtype=float)
    y = np.array([r["seconds_per_item"] for r in rows])
    slope, intercept = np.polyfit(x, y, 1)
    r2 = 1 - ((y - (slope * x + intercept)) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
    marginal = float(((y[-1] - y[-2]) / (x[-1] - x[-2])) / ((y[1] - y[0]) / (x[1] - x[0]))) if len(x) > 2 else None
    result = {"rows": rows, "fit_seconds_per_document": slope, "fit_intercept_s": intercept, "fit_r2": r2,
              "marginal_cost_ratio_long_to_short": marginal, "engine": backend, "model": args.model_path}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return result


if __name__ == "__main__":
    main()
