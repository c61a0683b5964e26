"""LoCoMo data: the real file's format, the train/test split, the prompts, and a generator of look-alike
conversations for offline use and tests.

``locomo10.json`` is a list of conversations, each with ``sample_id``, ``conversation`` (``speaker_a``,
``speaker_b``, ``session_N_date_time``, ``session_N``: turns with ``speaker``, ``dia_id`` ("D1:3"), ``text``),
``observation`` (``session_N_observation``: per speaker a list of ``[fact, evidence]``, evidence a dia_id or a
list of them), ``session_summary``, ``event_summary`` and ``qa`` (``question``, ``answer``, ``evidence``,
``category``: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial; adversarial items carry
``adversarial_answer`` and usually no ``answer``).

A conversation's initial memories are its observations: one episodic memory per fact, with the session, speaker,
evidence ids and session date in its metadata. Each QA item becomes one training prompt.
"""

import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATEGORIES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}
NOT_MENTIONED = "Not mentioned in the conversation"


class LocomoError(ValueError):
    pass


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    memories: list[dict[str, Any]]
    qa: list[dict[str, Any]]  # question, answer (str), category (int), evidence (list of dia_ids)

    @property
    def asked_evidence(self) -> list[str]:
        """The dia_ids any of its questions names, sorted: a memory of none of them is noise to every question."""
        return sorted({e for q in self.qa for e in q["evidence"]})


def session_day(date: str) -> str:
    """A session's date without its time ("5:30 pm on 18 November, 2022" -> "18 November, 2022")."""
    return date.split(" on ")[-1]


def _session(key: str, suffix: str) -> int | None:
    match = re.fullmatch(rf"session_(\d+){suffix}", key)
    return int(match.group(1)) if match else None


def _evidence(value: Any) -> list[str]:
    if isinstance(value, str):
        return [e.strip() for e in re.split(r"[,;]", value) if e.strip()]
    if isinstance(value, list):
        return [str(e) for e in value]
    return []


def parse_conversation(raw: Any, where: str, include_adversarial: bool, problems: list[str]) -> Conversation | None:
    """One conversation of the file; problems are appended to ``problems`` (naming ``where`` and the field) and
    the bad parts skipped. None when nothing usable is left."""
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected an object, got {type(raw).__name__}; skipped")
        return None
    sample_id = str(raw.get("sample_id", where))
    where = f"{where} (sample_id {sample_id})"
    for key in ("observation", "qa", "conversation"):
        if not isinstance(raw.get(key), dict if key != "qa" else list):
            problems.append(f"{where}: field {key!r} is missing or of the wrong type; conversation skipped")
            return None
    dates = {_session(k, "_date_time"): v for k, v in raw["conversation"].items() if _session(k, "_date_time")}
    memories = []
    for key in sorted(raw["observation"], key=lambda k: _session(k, "_observation") or 0):
        session = _session(key, "_observation")
        per_speaker = raw["observation"][key]
        if session is None or not isinstance(per_speaker, dict):
            problems.append(f"{where}: observation key {key!r} is not session_N_observation with speakers; skipped")
            continue
        for speaker, facts in per_speaker.items():
            for k, fact in enumerate(facts if isinstance(facts, list) else []):
                text, evidence = (fact[0], fact[1] if len(fact) > 1 else []) if isinstance(fact, list) and fact \
                    else (fact, [])
                if not isinstance(text, str) or not text.strip():
                    problems.append(f"{where}: observation.{key}.{speaker}[{k}] has no text; skipped")
                    continue
                memories.append({"id": f"s{session}-{speaker.lower()}-{k + 1}", "content": text.strip(),
                                 "memory_type": "episodic", "source": "observation",
                                 "metadata": {"session": session, "speaker": speaker, "evidence": _evidence(evidence),
                                              "date": str(dates.get(session, ""))}})
    qa = []
    for k, item in enumerate(raw["qa"]):
        at = f"{where}: qa[{k}]"
        if not isinstance(item, dict) or not isinstance(item.get("question"), str):
            problems.append(f"{at}: no 'question' string; skipped")
            continue
        category = item.get("category")
        if category not in CATEGORIES:
            problems.append(f"{at}: category {category!r} is not 1-5; skipped")
            continue
        if category == 5 and not include_adversarial:
            continue
        answer = item.get("answer", NOT_MENTIONED if category == 5 else None)
        if answer is None or str(answer).strip() == "":
            problems.append(f"{at}: no 'answer'; skipped")
            continue
        qa.append({"question": item["question"].strip(), "answer": str(answer).strip(), "category": category,
                   "evidence": _evidence(item.get("evidence"))})
    if not memories or not qa:
        problems.append(f"{where}: no {'observations' if not memories else 'usable QA items'}; skipped")
        return None
    return Conversation(sample_id, memories, qa)


def load_locomo(path: str | Path, include_adversarial: bool = False) -> tuple[list[Conversation], list[str]]:
    """The conversations of a ``locomo10.json``-format file and the problems found in it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LocomoError(f"{path}: no such file") from None
    except json.JSONDecodeError as err:
        raise LocomoError(f"{path}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if not isinstance(data, list):
        raise LocomoError(f"{path}: expected a list of conversations, got {type(data).__name__}")
    problems: list[str] = []
    conversations = [c for i, raw in enumerate(data)
                     if (c := parse_conversation(raw, f"{path}[{i}]", include_adversarial, problems))]
    return conversations, problems


@dataclass(frozen=True)
class Split:
    """Conversations for training, for choosing settings (validation) and for the one final report (test)."""
    train: list[Conversation]
    val: list[Conversation]
    test: list[Conversation]


def split(conversations: list[Conversation], n_test: int = 3, seed: int = 42, n_val: int = 0) -> Split:
    """By conversation, reproducibly: sorted by sample_id, shuffled with ``seed``, the last ``n_test`` for test and
    the ``n_val`` before them for validation. The test conversations do not depend on ``n_val``: a validation split
    is taken from the training side only."""
    if not 0 < n_test < len(conversations) - n_val or n_val < 0:
        raise LocomoError(f"cannot hold out {n_test} test and {n_val} validation conversations of "
                          f"{len(conversations)}: at least one must be left for training")
    order = sorted(conversations, key=lambda c: c.sample_id)
    random.Random(seed).shuffle(order)
    held = n_test + n_val
    return Split(order[:-held], order[-held:-n_test], order[-n_test:])


def prompt_records(conversations: list[Conversation], extra_questions: int = 3, seed: int = 42) -> list[dict]:
    """One record per QA item: the question as the prompt, the answer as the label, and in the metadata the
    conversation's initial memories, the category, up to ``extra_questions`` other questions of the same
    conversation (the reward can score those too; each with its evidence, which ``headroom.py`` reads) and the
    evidence any of its questions names (``asked_evidence``: what the demonstrated baseline keeps; a memory of
    other evidence is noise to it)."""
    rng = random.Random(seed)
    records = []
    for conversation in conversations:
        asked = conversation.asked_evidence
        for k, item in enumerate(conversation.qa):
            others = [q for j, q in enumerate(conversation.qa) if j != k]
            extra = rng.sample(others, min(extra_questions, len(others)))
            records.append({"prompt": item["question"], "label": item["answer"], "metadata": {
                "sample_id": conversation.sample_id, "category": item["category"], "evidence": item["evidence"],
                "memories": conversation.memories, "asked_evidence": asked,
                "extra_qa": [{k2: q[k2] for k2 in ("question", "answer", "category", "evidence")} for q in extra]}})
    return records


# ---- a generator of LoCoMo-format conversations ---------------------------------------------------------------

_NAMES = ["Caroline", "Melanie", "Jon", "Gina", "Nate", "Joanna", "Tim", "John", "Maria", "Deborah", "Andrew",
          "Audrey", "Evan", "Sam", "Calvin", "Dave", "Priya", "Omar", "Lena", "Kofi"]
_PETS = ["dog", "cat", "parrot", "rabbit", "turtle", "hamster"]
_PET_NAMES = ["Rex", "Luna", "Biscuit", "Pepper", "Milo", "Nala", "Ziggy", "Coco", "Oreo", "Maple"]
_INSTRUMENTS = ["guitar", "violin", "piano", "drums", "cello", "flute", "ukulele", "saxophone"]
_CITIES = ["Lisbon", "Kyoto", "Denver", "Oslo", "Nairobi", "Lima", "Prague", "Hanoi", "Seville", "Boston"]
_HOBBIES = ["pottery", "rock climbing", "baking sourdough", "birdwatching", "knitting", "chess", "kayaking",
            "photography", "gardening", "painting"]
_JOBS = ["nurse", "carpenter", "teacher", "software tester", "chef", "librarian", "pilot", "counselor"]
_FILLER = ["{a} had a busy week at work.", "{a} watched a movie with friends.", "{a} felt tired after a long day.",
           "{a} cooked dinner for the family.", "{a} went for a walk in the park.", "{a} caught up on sleep.",
           "{a} called an old friend.", "{a} cleaned the apartment."]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def _unused(rng: random.Random, values: list[str], used: set[str]) -> str:
    """One of ``values`` that ``used`` (the speaker's earlier ones of the kind) does not hold: a second trip goes to
    another city and a second pet is of another kind, so that "When did Calvin go to Denver?" and "What is the
    name of Calvin's dog?" have one answer each."""
    return rng.choice([v for v in values if v not in used] or values)


def _facts(rng: random.Random, speaker: str, other: str, date: str,
           used: dict[str, set[str]]) -> list[tuple[str, str, list[dict]]]:
    """(what the speaker says, the observation, QA items) for the facts of one session. ``used``: the speaker's
    stated values so far, by kind (updated). A question that asks for the latest of a kind of fact ("Where did
    Calvin travel to?") also carries ``dated``, its words with the session's month, for when the speaker states
    that kind in another session too (``_date_repeated``)."""
    pet, pet_name = _unused(rng, _PETS, used.get("pet", set())), rng.choice(_PET_NAMES)
    instrument, city, hobby, job = (_unused(rng, values, used.get(kind, set())) for kind, values in
                                    (("instrument", _INSTRUMENTS), ("city", _CITIES), ("hobby", _HOBBIES),
                                     ("job", _JOBS)))
    day = session_day(date)
    month = day.split(" ", 1)[-1].replace(",", "")  # "26 January, 2023" -> "January 2023"
    chosen = rng.sample([
        ("pet", pet, f"I adopted a {pet} and named it {pet_name}!", f"{speaker} adopted a {pet} named {pet_name}.",
         [{"question": f"What is the name of {speaker}'s {pet}?", "answer": pet_name, "category": 4},
          {"question": f"When did {speaker} adopt the {pet}?", "answer": day, "category": 2},
          {"question": f"What is the name of {other}'s {pet}?", "adversarial_answer": pet_name, "category": 5}]),
        ("instrument", instrument, f"I started taking {instrument} lessons.",
         f"{speaker} started learning to play the {instrument}.",
         [{"question": f"Which instrument is {speaker} learning?", "answer": instrument, "category": 4,
           "dated": f"Which instrument did {speaker} start learning in {month}?"},
          {"question": f"Would {speaker} enjoy a {instrument} concert?", "answer": f"Yes, {speaker} plays the "
           f"{instrument}", "category": 3}]),
        ("city", city, f"I just got back from a trip to {city}.", f"{speaker} travelled to {city}.",
         [{"question": f"Where did {speaker} travel to?", "answer": city, "category": 4,
           "dated": f"Where did {speaker} travel to in {month}?"},
          {"question": f"When did {speaker} go to {city}?", "answer": day, "category": 2}]),
        ("hobby", hobby, f"I've taken up {hobby} lately.", f"{speaker} took up {hobby} as a hobby.",
         [{"question": f"What hobby did {speaker} take up?", "answer": hobby, "category": 4,
           "dated": f"What hobby did {speaker} take up in {month}?"}]),
        ("job", job, f"I got a new job as a {job}.", f"{speaker} started working as a {job}.",
         [{"question": f"What is {speaker}'s new job?", "answer": job, "category": 4,
           "dated": f"What job did {speaker} start in {month}?"}]),
    ], 2)
    for kind, value, *_ in chosen:
        used.setdefault(kind, set()).add(value)
    return [fact for _, _, *fact in chosen]


def _date_repeated(qa: list[dict]) -> list[dict]:
    """The conversation's QA with one answer per question: a question whose words another item of the
    conversation shares (a speaker who took up a hobby in two sessions) is asked with its session's month
    (``dated``) in every item that shares them, and an adversarial question that names a fact someone did state
    (both speakers adopted a dog) is left out. Without this, 43% of the generated questions shared their words
    with another answer's (records/mem_update_log.md, ninth lease): no store could answer both."""
    count = Counter(item["question"] for item in qa)
    out = []
    for item in qa:
        item = dict(item)
        dated = item.pop("dated", None)
        if count[item["question"]] > 1 and dated is not None:
            item["question"] = dated
        out.append(item)
    stated = {item["question"] for item in out if "answer" in item}
    out = [item for item in out if "answer" in item or item["question"] not in stated]
    answers: dict[str, set[str]] = {}
    for item in out:
        answers.setdefault(item["question"], set()).add(str(item.get("answer", item.get("adversarial_answer"))))
    clash = sorted(q for q, a in answers.items() if len(a) > 1)
    if clash:  # a new kind of fact without ``dated``, or a month with two sessions: the generator's own error
        raise RuntimeError(f"generated questions with two answers each: {clash[:3]}")
    return out


def _multi_hop(said: list[tuple[str, str]], speaker: str) -> dict | None:
    """A question that needs two facts of one session (the trip, then the job), with both as its evidence; None
    unless the speaker told both. ``said``: (observation, dia_id) of the session's facts."""
    trip = next(((f, d) for f, d in said if " travelled to " in f), None)
    job = next(((f, d) for f, d in said if " started working as a " in f), None)
    if trip is None or job is None:
        return None
    city, work = trip[0].split(" travelled to ")[1].rstrip("."), job[0].split(" started working as a ")[1].rstrip(".")
    return {"question": f"What did {speaker} start after the trip to {city}?", "answer": f"a job as a {work}",
            "category": 1, "evidence": [trip[1], job[1]]}


def generate_locomo(num_conversations: int = 10, sessions: int = 4, filler: int = 2, seed: int = 0) -> list[dict]:
    """Conversations in ``locomo10.json``'s format: two speakers, ``sessions`` dated sessions, per session and
    speaker two facts (said in the dialogue, recorded as observations with their dia_ids, asked about in the QA,
    categories 1-5) and ``filler`` facts nobody asks about."""
    rng = random.Random(seed)
    out = []
    for c in range(num_conversations):
        a, b = rng.sample(_NAMES, 2)
        conversation: dict[str, Any] = {"speaker_a": a, "speaker_b": b}
        observation, summaries, events, qa = {}, {}, {}, []
        used: dict[str, dict[str, set[str]]] = {a: {}, b: {}}  # each speaker's values so far, by kind
        for s in range(1, sessions + 1):
            # a session a month, in order across the new year (a conversation that has its second session in
            # December has its third in January of the next year, so that "new" means later)
            month = c % 12 + s
            date = f"{rng.randint(1, 11)}:{rng.choice(['00', '15', '30', '45'])} pm on {rng.randint(1, 28)} " \
                   f"{MONTHS[month % 12]}, {2022 + month // 12}"
            conversation[f"session_{s}_date_time"] = date
            turns, per_speaker = [], {a: [], b: []}
            for speaker, other in ((a, b), (b, a)):
                for said, fact, questions in _facts(rng, speaker, other, date, used[speaker]):
                    dia_id = f"D{s}:{len(turns) + 1}"
                    turns.append({"speaker": speaker, "dia_id": dia_id, "text": said})
                    per_speaker[speaker].append([fact, dia_id])
                    qa += [{**q, "evidence": [dia_id]} for q in questions]
                if (two_hops := _multi_hop(per_speaker[speaker], speaker)) is not None:
                    qa.append(two_hops)
                for text in rng.sample(_FILLER, filler):
                    dia_id = f"D{s}:{len(turns) + 1}"
                    turns.append({"speaker": speaker, "dia_id": dia_id, "text": "Nothing much, really."})
                    per_speaker[speaker].append([text.format(a=speaker), dia_id])
            conversation[f"session_{s}"] = turns
            observation[f"session_{s}_observation"] = per_speaker
            summaries[f"session_{s}_summary"] = " ".join(f for p in per_speaker.values() for f, _ in p)
            events[f"events_session_{s}"] = {**{k: [f for f, _ in v] for k, v in per_speaker.items()},
                                             "date": session_day(date)}
        out.append({"sample_id": f"gen-{c}", "conversation": conversation, "observation": observation,
                    "session_summary": summaries, "event_summary": events, "qa": _date_repeated(qa)})
    return out
