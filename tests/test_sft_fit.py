"""tools/sft_fit.py: the trained tokens' NLL lines up with the logits as the trainer's loss does, and on a real
model (SmolLM2-135M on the CPU) a chat whose reply is the model's own greedy one reads as fitted, one with another
reply does not."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import sft_fit  # noqa: E402

from vime_ext.agent.chat_mask import MaskedSequence  # noqa: E402


def test_masked_nll_scores_each_trained_token_from_the_place_before_it():
    torch.manual_seed(0)
    logits = torch.randn(6, 11)
    sequence = MaskedSequence([3, 1, 4, 1, 5, 9], [0, 0, 1, 1, 0, 1])
    by_hand = -sum(float(logits[i - 1].log_softmax(-1)[sequence.tokens[i]]) for i in (2, 3, 5))
    total, count = sft_fit.masked_nll(logits, sequence)
    assert count == 3
    assert total == pytest.approx(by_hand, rel=1e-6)


def test_a_chat_of_the_models_own_reply_fits_and_another_does_not(smollm2_dir, tmp_path, capsys):
    model, tokenizer = sft_fit.load(str(smollm2_dir), "cpu")
    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    prompt = tokenizer.apply_chat_template(question, add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)["input_ids"]
    out = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    own = tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True).strip()
    assert own
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": question + [{"role": "assistant", "content": reply}]}) + "\n"
                             for reply in (own, "Zebra quantum umbrella lattice.")))
    sft_fit.main(["--hf", str(smollm2_dir), "--chats", str(chats), "--n", "2", "--generate", "8",
                  "--device", "cpu"])
    printed = capsys.readouterr().out
    assert "mean over 2 chats" in printed and "chats.jsonl:1" in printed and "chats.jsonl:2" in printed

    from vime_ext.agent.chat_mask import ChatMasker
    from vime_ext.data.chat_dataset import read_chats
    fitted, other = (sft_fit.chat_fit(model, tokenizer, ChatMasker(tokenizer), r, 8) for r in read_chats(chats))
    assert fitted.top[0][0] == fitted.first_token  # the greedy reply's first token is the top one
    with torch.no_grad():  # taken from the whole chat's forward: the prompt's own forward gives the same
        alone = model(prompt).logits[0, -1].softmax(-1)
    assert abs(fitted.first_prob - float(alone.max())) < 1e-4
    assert fitted.greedy.startswith(own[:4])
    assert other.top[0][0] != other.first_token
    assert math.isfinite(other.nll) and other.nll > fitted.nll + 1.0
    assert fitted.trained > 0 and other.trained > 0


def test_sft_fit_after_sft_checks_the_saves_last_iteration_and_never_fails_the_run(tiny_hf_dirs, tmp_path):
    """_common.sh's SFT_FIT step: the save's last iteration as the HF checkpoint its evaluation serves (here one
    already converted, which tools/convert_iteration_to_hf.sh reuses), both checkpoints' fit in SAVE/sft_fit.txt;
    a check that cannot run says so and returns 0, so that the recipe goes on to GRPO."""
    import os
    import subprocess

    root, model = Path(__file__).resolve().parents[1], tiny_hf_dirs["llama"]
    save = tmp_path / "sft"
    (save / "iter_0000003").mkdir(parents=True)
    (save / "latest_checkpointed_iteration.txt").write_text("3\n")
    (save / "hf").mkdir()
    (save / "hf" / "iter_0000003").symlink_to(model)  # the "trained" checkpoint: the base itself
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": "Hello there."}]}) + "\n")

    def run(chats_file):
        script = f'source "{root}/_common.sh"; sft_fit "{model}" "{save}" "{chats_file}" 1'
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # `python` is this interpreter
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PATH": path})

    done = run(chats)
    assert done.returncode == 0, done.stderr[-2000:]
    report = (save / "sft_fit.txt").read_text()
    assert report.count("mean over 1 chats") == 2 and f"{save}/hf/iter_0000003:" in report
    assert "mean over 1 chats" in done.stdout
    done = run(tmp_path / "missing.jsonl")
    assert done.returncode == 0 and "SFT_FIT: the check failed" in done.stderr
