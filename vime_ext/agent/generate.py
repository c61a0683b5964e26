"""The default single-turn generate function: chat-template the prompt, generate, fill the Sample.

Custom generate functions (``--custom-generate-function-path``) have the same signature (see ``plugins``).
"""

from vime_ext.agent.sample import Sample, Status
from vime_ext.engines.client import EngineUnavailable
from vime_ext.engines.protocol import InvalidRequest, SamplingParams


def prompt_token_ids(tokenizer, prompt: str | list[dict]) -> list[int]:
    """Chat messages go through the tokenizer's chat template; a plain string is tokenized as is."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


async def generate(args, sample: Sample, sampling_params: SamplingParams, evaluation: bool = False) -> Sample:
    """Fill ``sample`` in place through ``args.rollout_client``; failures land on the sample (status + reason)
    instead of raising."""
    tokenizer = args.tokenizer
    try:
        prompt_ids = prompt_token_ids(tokenizer, sample.prompt)
        result = await args.rollout_client.generate(prompt_ids, sampling_params,
                                                    session_id=f"{sample.group_index}-{sample.index}")
    except InvalidRequest as err:
        return sample.fail(Status.FAILED, str(err))
    except EngineUnavailable as err:
        return sample.fail(Status.ABORTED, str(err))
    sample.tokens = prompt_ids + result.token_ids
    sample.response = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    sample.response_length = len(result.token_ids)
    sample.loss_mask = [1] * len(result.token_ids)
    sample.rollout_log_probs = result.log_probs
    sample.status = Status.COMPLETED if result.finish_reason == "stop" else Status.TRUNCATED
    return sample
