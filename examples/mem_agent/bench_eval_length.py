"""Benchmark (not a test): MemAgent evaluation time per item against document length. The loop reads a
document chunk by chunk with a fixed-size memory, so its cost should grow linearly with the number of
documents; this measures it on generated RULER-HQA-format files and fits a line.

    python -m examples.mem_agent.bench_eval_length --model-path HF_DIR [--lengths 4 8 16 32] [--items 8]
        [--engine-backend hf|vllm] [--chunk-tokens 256] [--max-memory 32] [--max-final 16] [--out bench.json]

Prints, per length: documents, document tokens, chunks, seconds per item; then the linear fit of seconds per
item on the number of documents (slope, intercept, R^2) and the marginal cost per added document between the
two longest lengths over that between the two shortest, which is about 1 when the growth is linear (above 1:
faster than linear).
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--n-proc", type=int, default=8)
    parser.add_argument("--engine-backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--max-memory", type=int, default=32)
    parser.add_argument("--max-final", type=int, default=16)
    parser.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from examples.mem_agent.data import write_eval_file
    from examples.mem_agent.eval_ruler_hqa import main as run_eval
    from vime_ext.rollout.engines import EngineConfig, launch_engine, wait_until_serving

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    work = Path(tempfile.mkdtemp(prefix="mem_bench_"))
    (work / "mem.json").write_text(json.dumps({"mem_chunk_tokens": args.chunk_tokens,
                                               "mem_max_memory": args.max_memory, "mem_max_final": args.max_final}))
    vllm = args.engine_backend == "vllm"
    engine = launch_engine(EngineConfig(args.model_path, backend=args.engine_backend, dtype="float32",
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
                      "--length", str(n), "--save-dir", str(work / "out"), "--save-file", "bench", "--n-proc",
                      str(args.n_proc), "--custom-config-path", str(work / "mem.json"), "--temperature", "0.7"])
            seconds = (time.perf_counter() - start) / args.items
            rows.append({"documents": n, "document_tokens": float(doc_tokens),
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
              "marginal_cost_ratio_long_to_short": marginal,
              "engine": args.engine_backend, "model": args.model_path}
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
