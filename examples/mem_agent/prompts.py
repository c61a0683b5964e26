"""The prompts of the memory agent (written for this project)."""

NO_MEMORY = "No previous memory"

# Short and direct on purpose: SmolLM2-135M (the CPU preset) wrote unrelated text for a longer version of this
# instruction; with this one its notes quote the documents.
_MEMORY = """You read a long text one part at a time and keep notes. Your notes are all you will have at the end.

Your notes so far: {memory}

Next part of the text:
{chunk}

Which sentences of your notes and of this part help answer the question "{question}"? Write them as your new notes."""

_FINAL = {
    "boxed": """Question: {question}

Your notes from reading the whole text:
{memory}

Answer the question from your notes. Reason briefly, then give the final answer as \\boxed{{answer}}.""",
    "answer_is": """Your notes from reading the whole text:
{memory}

Question: {question}
Answer from your notes. Reason briefly, then finish with "The answer is <answer>".""",
}


def memory_prompt(question: str, memory: str, chunk: str) -> str:
    return _MEMORY.format(question=question, memory=memory, chunk=chunk)


def final_prompt(question: str, memory: str, answer_format: str = "boxed") -> str:
    return _FINAL[answer_format].format(question=question, memory=memory)
