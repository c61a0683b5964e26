"""The trajectory builder on real chat templates (SmolLM2's, from its GGUF; the ChatML one vime_ext gives Qwen's
tokenizer): a conversation grown turn by turn equals the template's rendering of the whole conversation, the
policy's tokens are the only trained ones, and a reply cut at the length limit is closed as the template would."""

import pytest

from vime_ext.agent.sample import Sample, Status
from vime_ext.agent.trajectory import Trajectory
from vime_ext.rollout.validate import check_sample


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tokenizer(request, tmp_path_factory):
    from tests.conftest import real_tokenizer

    return real_tokenizer(request.param, tmp_path_factory.mktemp("tok"))


def rendered(tokenizer, messages) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def reply_ids(tokenizer, text: str, closed: bool = True) -> list[int]:
    """What an engine returns for a reply: its tokens, ending with the end-of-turn token when it stopped."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")] if closed else ids


def test_turn_by_turn_equals_the_whole_conversation(tokenizer):
    question = [{"role": "user", "content": "Find the capital of France."}]
    traj = Trajectory(tokenizer, question)
    assert traj.tokens == rendered(tokenizer, question) and traj.prompt_length == len(traj.tokens)

    first = reply_ids(tokenizer, "search: capital of France")
    traj.append_model(first, [-0.5] * len(first), "stop")
    observation = {"role": "user", "content": "result: Paris is the capital of France."}
    traj.append_messages([observation])
    second = reply_ids(tokenizer, "The answer is Paris.")
    traj.append_model(second, [-0.25] * len(second), "stop")

    whole = question + [{"role": "assistant", "content": "search: capital of France"}, observation]
    assert traj.tokens[:-len(second)] == rendered(tokenizer, whole)
    trained = [t for t, m in zip(traj.tokens[traj.prompt_length:], traj.loss_mask) if m]
    assert trained == first + second  # exactly what the engine sampled, nothing else
    assert [lp for lp, m in zip(traj.log_probs, traj.loss_mask) if not m] == [0.0] * (len(traj.loss_mask) -
                                                                                   len(trained))
    sample = traj.to_sample(Sample(prompt=question, group_index=1, index=6, label="Paris"))
    sample.reward = 1.0
    check_sample(sample)
    assert (sample.index, sample.group_index, sample.label) == (6, 1, "Paris")
    assert sample.status == Status.COMPLETED and sample.response.endswith("The answer is Paris.")
    assert [t.finish_reason for t in traj.turns] == ["stop", "stop"] and sample.metrics["turns"] == 2.0


def test_a_cut_reply_is_closed_before_the_next_message(tokenizer):
    question = [{"role": "user", "content": "Count to five."}]
    cut, ended = Trajectory(tokenizer, question), Trajectory(tokenizer, question)
    open_reply, closed_reply = reply_ids(tokenizer, "one two", closed=False), reply_ids(tokenizer, "one two")
    cut.append_model(open_reply, [-1.0] * len(open_reply), "length")
    ended.append_model(closed_reply, [-1.0] * len(closed_reply), "stop")
    for traj in (cut, ended):
        traj.append_messages([{"role": "user", "content": "go on"}])
    assert cut.tokens == ended.tokens  # the end-of-turn token the cut reply never wrote is added, masked
    assert sum(cut.loss_mask) == sum(ended.loss_mask) - 1
    assert cut.turns[0].status == Status.TRUNCATED


def test_a_failed_call_fails_the_sample(tokenizer):
    import asyncio

    from vime_ext.engines.client import RolloutClient
    from vime_ext.engines.protocol import SamplingParams
    from vime_ext.net import free_port

    traj = Trajectory(tokenizer, [{"role": "user", "content": "hi"}])

    async def run():
        client = RolloutClient(f"http://127.0.0.1:{free_port()}", max_retries=0)
        try:
            return await traj.generate(client, SamplingParams(max_new_tokens=2))
        finally:
            await client.close()

    assert asyncio.run(run()) is None and traj.finished
    sample = traj.to_sample(Sample(prompt="hi"))
    assert sample.status == Status.ABORTED and "EngineUnavailable" in sample.error
