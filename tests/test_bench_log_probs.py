"""tools/bench_log_probs.py on the CPU with a small vocabulary: both modes run through the trainer's kernel and
the compiled one (Inductor's C++ backend here, Triton on a GPU) gives the eager figures."""

import json

from tools.bench_log_probs import main


def test_the_bench_times_both_modes_and_finds_them_equal(tmp_path):
    out = tmp_path / "log_probs.json"
    result = main(["--tokens", "40", "--vocab", "300", "--chunk", "16", "--repeats", "1", "--device", "cpu",
                   "--out", str(out)])
    assert json.loads(out.read_text()) == result
    for mode in ("eager", "compiled"):
        assert result[mode]["forward_ms"] > 0 and "forward_gb_per_s_at_one_read" in result[mode]
    assert set(result["compiled"]["max_abs_diff"]) == {"values", "entropy", "gradient"}
    diff = result["compiled"]["max_abs_diff"]
    assert diff["values"] < 1e-4 and diff["entropy"] < 1e-4
    assert diff["gradient"] < 1e-2  # bf16, gradients of at most 1 in size: within a last bit
    assert result["compiled_speedup"] > 0
