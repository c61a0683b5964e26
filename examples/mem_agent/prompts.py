"""The prompts of the memory agent (written for this project)."""

NO_MEMORY = "No previous memory"

_MEMORY = """You are answering a question about a long text that you can only read one section at a time.
After each section you keep notes; the notes are all you will have when you answer.

Question: {question}

Your notes so far:
{memory}

Next section of the text:
{chunk}

Write your updated notes: keep what still matters for the question, add anything useful from this section,
and drop what is irrelevant. Reply with the notes only."""

_FINAL = {
    "boxed": """Question: {question}

Your notes from reading the whole text:
{memory}

Answer the question from your notes. Reason briefly, then give the final answer as \\boxed{{answer}}.""",
    "answer_is": """Question: {question}

Your notes from reading the whole text:
{memory}

Answer the question from your notes. Reason briefly, then finish with "The answer is <answer>".""",
}


def memory_prompt(question: str, memory: str, chunk: str) -> str:
    return _MEMORY.format(question=question, memory=memory, chunk=chunk)


def final_prompt(question: str, memory: str, answer_format: str = "boxed") -> str:
    return _FINAL[answer_format].format(question=question, memory=memory)
