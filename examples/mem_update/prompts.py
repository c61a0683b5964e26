"""MemUpdate's prompts (written for this project)."""

import re

SYSTEM = """You look after a memory store about a conversation between {speakers}. Later, someone will ask a \
question about the conversation, and it will be answered only from the {top_k} memories that a search for the \
question returns.

Use the tools to get the store ready for that question: search for what it asks about, fix or complete those \
memories (a memory's date is shown with it but is not part of its text; write dates into the text when they \
matter), merge memories that repeat each other, split ones that mix topics, and delete noise. Keep the store \
about the same size and do not invent facts.

When the store is ready, reply with one short sentence and no tool call."""

USER = """Question to prepare for: {question}
The store holds {count} memories."""

READER = """Answer the question using only these memories. Reply with the answer alone, in a few words.

Memories:
{memories}

Question: {question}"""

# The rationale SFT's demonstrations can teach (demonstrations.py --rationale) opens the first reply after the
# search with one of these: "[The question asks about <month>. ]Answering it, from <date>: <id>, ..." or, when
# the results lack part of the evidence, INCOMPLETE. The rollout counts the episodes that write one (GRPO dropped
# it once, which the evaluation's episodes showed only after the run).
ASKS_ABOUT = "The question asks about "
ANSWERING = "Answering it, "
INCOMPLETE = "The results do not hold all that it needs, so its facts stay as they are."
# On fact lists the sweep's rationale (sweep.py, --rationale) is each delete's reason, written before the id it
# deletes: {"reason": "restated by f240", "memory_id": "f12"}.
RESTATED_BY = "restated by "
_REASON_FIRST = re.compile(r'\{\s*"reason"\s*:\s*"' + re.escape(RESTATED_BY) + r'f\d+"')


def wrote_rationale(response: str) -> bool:
    """Whether the policy's replies hold the demonstrations' rationale: the dialogue's sentence, or a fact-list
    delete whose reason, the fact that restates it, comes first."""
    return ANSWERING in response or INCOMPLETE in response or bool(_REASON_FIRST.search(response))


def speakers(memories: list[dict]) -> str:
    names = sorted({str(m.get("metadata", {}).get("speaker")) for m in memories
                    if m.get("metadata", {}).get("speaker")})
    return " and ".join(names) if names else "two people"
