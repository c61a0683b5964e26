"""A reward for tiny random models, which never write a right answer: the share of response tokens with an
even id. It only has to vary within a group, so the advantages (and the update) are not zero."""


def even_token_share(sample) -> float:
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    return sum(t % 2 == 0 for t in response) / max(len(response), 1)
