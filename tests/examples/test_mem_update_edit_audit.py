"""examples/mem_update/edit_audit.py: which memories a policy edits, read from evaluation episodes. Checked on the
records' real episodes of the 1.5B policy (the figures records/mem_update_manual_2026-12-04.md and docs/mem_update.md
quote) and on malformed input."""

import gzip
import json
from pathlib import Path

import pytest

from examples.mem_update.edit_audit import main, month_of, read_episodes
from examples.mem_update.prompts import wrote_rationale

ROOT = Path(__file__).resolve().parents[2]
SWEEP1 = ROOT / "records/mem_update_qwen1.5b_h200x2_sweep1/eval"
SWEEP2 = ROOT / "records/mem_update_qwen1.5b_h200_sweep2/eval"
FACT_VAL1 = ROOT / "records/mem_update_smollm2_h200_factval1/eval"


def test_the_audit_of_the_records_episodes_gives_the_figures_the_docs_quote(tmp_path, capsys):
    rows = main([f"no note={SWEEP1 / 'v1_sft_s0.samples.jsonl.gz'}",
                 f"rationale={SWEEP2 / 'v0_sft_s0.samples.jsonl.gz'}",
                 f"rationale + GRPO={SWEEP2 / 'v0_rl_s0.samples.jsonl.gz'}", "--out", str(tmp_path / "audit")])
    before, sft, rl = rows["no note"], rows["rationale"], rows["rationale + GRPO"]
    # without the rationale: the first search result in every episode, a memory of the month asked in 12 of 30
    assert (before.updated, before.updated_first_result, before.month_updated, before.updated_month_asked) == (
        64, 64, 30, 12)
    assert before.evidence_deletions is None and before.with_rationale == 0  # data from before asked_evidence
    # the rationale: written in 57 episodes, its date the month asked in 16 of 27; the habit weaker
    assert (sft.with_rationale, sft.month_rationales, sft.rationale_month_asked) == (57, 27, 16)
    assert (sft.updated_evidence, sft.updated_first_result, sft.updated_month_asked) == (50, 52, 17)
    assert sft.calls["delete"] == 1.0 and sft.evidence_deletions == 0.0
    # GRPO dropped the rationale and went back to the first result
    assert rl.with_rationale == 0 and (rl.updated_evidence, rl.updated_first_result, rl.updated_month_asked) == (
        45, 64, 12)
    assert rl.calls["delete"] == 2.0 and rl.evidence_deletions == pytest.approx(6 / 64)
    # the test behind the rollout's `rationale` metric (GRPO's logs) agrees with the audit on these episodes
    for path, written in ((SWEEP2 / "v0_sft_s0.samples.jsonl.gz", 57), (SWEEP2 / "v0_rl_s0.samples.jsonl.gz", 0)):
        assert sum(wrote_rationale(e["response"]) for e in read_episodes(path)) == written
    printed = capsys.readouterr().out
    assert "| rationale | 64 | 1.00 / 1.00 / 0.00 / 1.00 | 57 (16 of 27) | 50 of 64 | 52 of 64 | 17 of 30 |" in printed
    assert "| no note | 64 |" in printed and "3.53 (-) |" in printed
    assert (tmp_path / "audit.md").read_text().strip() == printed.strip()
    assert json.loads((tmp_path / "audit.json").read_text())["rationale"]["with_rationale"] == 57


def test_on_fact_lists_the_audit_tells_superseded_deletions_from_lost_answers(capsys):
    """The records' SmolLM2 episodes after SFT on the consolidation sweep (generated fact lists, SmolLM2's chat
    template): it deletes as many facts as the sweep, but superseded ones only at the rate its searches show them,
    the figures docs/mem_update.md quotes."""
    rows = main([f"SFT s0={FACT_VAL1 / 'sft_s0.samples.jsonl.xz'}", f"no-op={FACT_VAL1 / 'noop.samples.jsonl.xz'}"])
    sft, noop = rows["SFT s0"], rows["no-op"]
    assert sft.fact_deletions == pytest.approx({"superseded": 8.375, "latest": 6.45, "single": 8.20, "absent": 0.0},
                                               abs=0.005)
    assert sft.superseded_share(sft.fact_deletions) == "36.4%" and sft.superseded_share(sft.fact_shown) == "35.5%"
    assert sum(sft.fact_shown.values()) == pytest.approx(75.7, abs=0.05)  # 4.1 searches of up to 20 results
    assert noop.fact_deletions == dict.fromkeys(("superseded", "latest", "single", "absent"), 0.0)
    assert "| SFT s0 | 8.38 | 6.45 | 8.20 | 0.00 | 36.4% | 75.7, 35.5% |" in capsys.readouterr().out


def test_dates_and_months_are_read_as_the_data_writes_them():
    assert month_of("9:00 pm on 20 February, 2023") == ("February", "2023")
    assert month_of("Where did Andrew travel to in February 2023?") == ("February", "2023")
    assert month_of("What is Maria's new job?") is None


def test_a_file_that_is_not_an_evaluations_episodes_is_named(tmp_path):
    bad = tmp_path / "rows.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"response": "x", "prompt": "q?", "metadata": {}}\n{"prompt": "q?"}\n'))
    with pytest.raises(ValueError, match=r"rows.jsonl.gz:2: no field 'response'"):
        main([f"A={bad}"])
    unlabelled = tmp_path / "unlabelled.jsonl"
    unlabelled.write_text('{"response": "x", "prompt": "q?", "metadata": {"memories": []}}\n')
    with pytest.raises(ValueError, match=r"unlabelled.jsonl, episode 1: its metadata lacks the data's labels"):
        main([f"A={unlabelled}"])
    with pytest.raises(SystemExit):
        main(["no-equals-sign"])
