"""The HF engine's pause with abort, in process: the batch in flight stops even when the resume follows at once."""

import threading
import time

from vime_ext.engines.hf_engine import HFEngine
from vime_ext.engines.protocol import SamplingParams


def test_a_pause_and_an_immediate_resume_still_abort_the_batch_in_flight(tiny_hf_dirs):
    """A weight push may pause and resume within one decode step (CI saw this: ten pauses in a row went unseen,
    tests/engines/partial.py). The batch must still stop with its tokens so far, finish_reason "abort"."""
    engine = HFEngine(str(tiny_hf_dirs["llama"]), device="cpu")
    prompt = engine.tokenizer("The weather today is")["input_ids"]
    params = SamplingParams(temperature=1.0, max_new_tokens=engine.max_context - len(prompt), ignore_eos=True)
    results = []
    worker = threading.Thread(target=lambda: results.extend(engine.generate_batch([prompt, prompt], params)))
    worker.start()
    deadline = time.monotonic() + 60
    while not engine._lock.locked():  # generation holds the lock from its first token to its last
        assert time.monotonic() < deadline and worker.is_alive(), "generation never started"
        time.sleep(0.001)
    engine.pause(abort=True)
    engine.resume()
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert [r.finish_reason for r in results] == ["abort", "abort"]
    assert all(len(r.token_ids) == len(r.log_probs) < params.max_new_tokens for r in results)

    # the engine serves the next batch in full: the abort belonged to the batch it interrupted
    short = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True)
    assert [(r.finish_reason, len(r.token_ids)) for r in engine.generate_batch([prompt], short)] == [("length", 8)]
