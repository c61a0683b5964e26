import math

import pytest

from vime_ext.agent.sample import Sample, Status, Turn
from vime_ext.engines.protocol import InvalidRequest, SamplingParams, generate_request, parse_generate_response


def test_fail_keeps_the_reason_and_refuses_success_states():
    sample = Sample(prompt="hi")
    assert sample.fail(Status.ABORTED, "engine died").error == "engine died"
    assert sample.status == Status.ABORTED
    with pytest.raises(ValueError, match="FAILED or ABORTED"):
        sample.fail(Status.COMPLETED, "nope")


def test_a_turn_is_checked_where_it_is_built():
    Turn(tokens=[1, 2, 3], loss_mask=[1, 0], rollout_log_probs=[-0.1, -0.2])
    with pytest.raises(ValueError, match="Turn: rollout_log_probs has 1 entries but the response has 2 tokens"):
        Turn(tokens=[1, 2, 3], loss_mask=[1, 0], rollout_log_probs=[-0.1])
    with pytest.raises(ValueError, match="Turn: loss_mask is all 0: the sequence has no trainable token"):
        Turn(tokens=[1, 2, 3], loss_mask=[0, 0], rollout_log_probs=[0.0, 0.0])
    with pytest.raises(ValueError, match="Turn: tokens has 2 entries, not more than the 2 response tokens"):
        Turn(tokens=[1, 2], loss_mask=[1, 1], rollout_log_probs=[-0.1, -0.2])


def test_request_and_response_shapes():
    body = generate_request([5, 6], SamplingParams(temperature=0.5, max_new_tokens=3, seed=1), "r1")
    assert body["sampling_params"] == {"temperature": 0.5, "top_p": 1.0, "max_tokens": 3, "stop": [],
                                       "stop_token_ids": [], "logprobs": 0, "skip_special_tokens": False,
                                       "detokenize": False, "seed": 1}  # token ids answer; no stop string
    assert generate_request([5], SamplingParams(stop=("\n",)), "r2")["sampling_params"]["detokenize"] is True
    assert SamplingParams.from_vllm(body["sampling_params"]) == SamplingParams(temperature=0.5, max_new_tokens=3,
                                                                               seed=1)
    result = parse_generate_response({"prompt_token_ids": [5, 6], "choices": [
        {"token_ids": [7, 8], "finish_reason": "length",
         "logprobs": {"content": [{"token_id": 7, "logprob": -1.5}, {"token_id": 8, "logprob": -0.25}]}}]})
    assert (result.token_ids, result.log_probs, result.finish_reason, result.prompt_length) == \
        ([7, 8], [-1.5, -0.25], "length", 2)
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        parse_generate_response({"choices": [{"token_ids": [7, 8], "logprobs": {"content": [{"logprob": -1}]}}]})
    with pytest.raises(ValueError, match="malformed generate response"):
        parse_generate_response({"choices": []})
    # Without log-probs (--no-rollout-log-probs, evaluation): vLLM's null, and NaN per token ("not recorded")
    plain = SamplingParams(max_new_tokens=3, log_probs=False)
    assert generate_request([5], plain, "r3")["sampling_params"]["logprobs"] is None
    assert SamplingParams.from_vllm(plain.to_vllm()) == plain
    unrecorded = parse_generate_response({"choices": [{"token_ids": [7, 8], "logprobs": None}]}, log_probs=False)
    assert unrecorded.token_ids == [7, 8] and all(math.isnan(lp) for lp in unrecorded.log_probs)
    with pytest.raises(ValueError, match="2 tokens but 0 log-probs"):  # asked for and missing: the engine's fault
        parse_generate_response({"choices": [{"token_ids": [7, 8], "logprobs": None}]})
    with pytest.raises(InvalidRequest, match="temperature=-1"):
        generate_request([1], SamplingParams(temperature=-1), "r2")
