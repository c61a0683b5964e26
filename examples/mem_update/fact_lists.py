"""Generated fact lists in the format of MemoryAgentBench's fact consolidation (``fact_consolidation.py``), for
training an editor without touching the real set, which stays the test: the same numbered-list layout and the
same relation templates, with invented people, places and things.

Each list states ``facts`` facts; a share of its slots (``restated``) is stated again later with another value,
and the later statement holds. Its questions are single-hop (category 4), each about one slot, its gold answer
the slot's latest value; a share of them (``asked_restated``) is about restated slots. The defaults follow the
real 6K single-hop context: 455 facts of which 161 are restated later, 82 of 100 questions on a restated slot.

    python -m examples.mem_update.prepare_data --generate-fact-lists --num-conversations 12 --n-test 2 \\
        --n-val 2 --out-dir data/fact_lists
"""

import random
from dataclasses import dataclass

from examples.mem_update.locomo import Conversation

_SYLLABLES = ("ka", "lo", "mi", "ran", "tes", "vo", "dun", "el", "shi", "bar", "nu", "quen", "tor",
              "ve", "sa", "rim", "go", "lia", "pem", "zor", "ath", "ko", "wen", "yul")


@dataclass(frozen=True)
class Relation:
    template: str  # the fact, "{subject}" and "{value}" to fill: a shape of the real file's
    question: str  # a single-hop question about the slot, "{subject}" to fill
    subject: str  # what kind of thing the subject is: person | organisation | place | work | sport
    values: str  # the kind of value: city | country | language | sport | position | person | organisation | ...


RELATIONS = (
    Relation("{subject} is a citizen of {value}.", "Which country is {subject} a citizen of?", "person", "country"),
    Relation("{subject} was born in the city of {value}.", "In which city was {subject} born?", "person", "city"),
    Relation("{subject} died in the city of {value}.", "In which city did {subject} die?", "person", "city"),
    Relation("{subject} worked in the city of {value}.", "In which city did {subject} work?", "person", "city"),
    Relation("{subject} plays the position of {value}.", "Which position does {subject} play?", "person",
             "position"),
    Relation("{subject} speaks the language of {value}.", "Which language does {subject} speak?", "person",
             "language"),
    Relation("{subject} is married to {value}.", "Who is {subject} married to?", "person", "person"),
    Relation("{subject} is employed by {value}.", "Who employs {subject}?", "person", "organisation"),
    Relation("{subject} works in the field of {value}.", "In which field does {subject} work?", "person", "field"),
    Relation("{subject} is affiliated with the religion of {value}.", "Which religion is {subject} affiliated with?",
             "person", "religion"),
    Relation("{subject}'s child is {value}.", "Who is {subject}'s child?", "person", "person"),
    Relation("The univeristy where {subject} was educated is {value}.", "Where was {subject} educated?", "person",
             "university"),  # sic: the real file's spelling of the template
    Relation("The type of music that {subject} plays is {value}.", "Which type of music does {subject} play?",
             "person", "genre"),
    Relation("{subject} was founded by {value}.", "Who founded {subject}?", "organisation", "person"),
    Relation("{subject} was founded in the city of {value}.", "In which city was {subject} founded?",
             "organisation", "city"),
    Relation("The chief executive officer of {subject} is {value}.", "Who is the chief executive officer of "
             "{subject}?", "organisation", "person"),
    Relation("The headquarters of {subject} is located in the city of {value}.", "Where are the headquarters of "
             "{subject}?", "organisation", "city"),
    Relation("The capital of {subject} is {value}.", "What is the capital of {subject}?", "place", "city"),
    Relation("The name of the current head of state in {subject} is {value}.", "Who is the head of state of "
             "{subject}?", "place", "person"),
    Relation("The Prime Minister of {subject} is {value}.", "Who is the Prime Minister of {subject}?", "place",
             "person"),
    Relation("The official language of {subject} is {value}.", "What is the official language of {subject}?",
             "place", "language"),
    Relation("{subject} is located in the continent of {value}.", "On which continent is {subject}?", "place",
             "continent"),
    Relation("{subject} was written in the language of {value}.", "In which language was {subject} written?",
             "work", "language"),
    Relation("{subject} was created by {value}.", "Who created {subject}?", "work", "person"),
    Relation("The author of {subject} is {value}.", "Who is the author of {subject}?", "work", "person"),
    Relation("The director of {subject} is {value}.", "Who is the director of {subject}?", "organisation",
             "person"),
    Relation("The chairperson of {subject} is {value}.", "Who chairs {subject}?", "organisation", "person"),
    Relation("{subject} was performed by {value}.", "Who performed {subject}?", "work", "person"),
    Relation("{subject} was created in the country of {value}.", "In which country was {subject} created?",
             "sport", "country"),
)
_FIXED = {"position": ("goalkeeper", "pitcher", "point guard", "midfielder", "quarterback", "winger", "catcher",
                       "defender", "forward", "shortstop"),
          "continent": ("Asia", "Europe", "Africa", "Oceania", "Antarctica", "North America", "South America"),
          "field": ("chemistry", "linguistics", "astronomy", "economics", "botany", "geology", "law", "music"),
          "religion": ("Buddhism", "Christianity", "Islam", "Judaism", "Hinduism", "Shinto", "Jainism")}
_SHAPES = {"person": "{A} {B}", "organisation": "{A} {B} Company", "place": "{A}land", "work": "The {A} of {B}",
           "sport": "{A}ball", "city": "{A}{b} City", "country": "Republic of {A}", "language": "{A}ese",
           "university": "University of {A}", "genre": "{a} rock"}


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables))


class _Names:
    """Invented names of each kind, none given twice in a list (a value of one kind is never a subject's name)."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def __call__(self, kind: str) -> str:
        if kind in _FIXED:
            return self.rng.choice(_FIXED[kind])
        shape = _SHAPES[kind]
        while True:
            a, b = _word(self.rng, 2), _word(self.rng, 2 if kind == "person" else 1)
            name = shape.format(A=a.capitalize(), B=b.capitalize(), a=a, b=b)
            if name not in self.used:
                self.used.add(name)
                return name


def generate_fact_list(index: int, facts: int = 455, restated: int = 161, questions: int = 100,
                       asked_restated: float = 0.82, seed: int = 0) -> Conversation:
    """One list (``facts`` numbered facts, ``restated`` of them stated again later with another value) and its
    ``questions``, reproducible from ``seed`` and ``index``."""
    if not 0 <= restated <= facts // 2:
        raise ValueError(f"restated {restated}: a list of {facts} facts restates between 0 and {facts // 2}")
    rng = random.Random(f"{seed}-{index}")
    name = _Names(rng)
    subjects: dict[str, list[str]] = {}
    slots: list[tuple[Relation, str]] = []
    taken = set()
    while len(slots) < facts - restated:  # each subject gets a few relations of its kind
        relation = rng.choice(RELATIONS)
        pool = subjects.setdefault(relation.subject, [])
        if not pool or rng.random() < 0.3:
            pool.append(name(relation.subject))
        subject = rng.choice(pool)
        if (relation.template, subject) not in taken:
            taken.add((relation.template, subject))
            slots.append((relation, subject))
    # the order of first statements, then each restatement put somewhere after its first
    order: list[tuple[int, str]] = [(k, name(relation.values)) for k, (relation, _) in enumerate(slots)]
    for k in rng.sample(range(len(slots)), restated):
        first = next(i for i, (slot, _) in enumerate(order) if slot == k)
        value = order[first][1]
        while (new := name(slots[k][0].values)) == value:  # a fixed pool may draw the same value again
            pass
        order.insert(rng.randint(first + 1, len(order)), (k, new))
    memories, latest = [], {}
    for position, (k, value) in enumerate(order):
        relation, subject = slots[k]
        text = relation.template.format(subject=subject, value=value)
        memories.append({"id": f"f{position}", "content": f"{position}. {text}", "memory_type": "semantic",
                         "source": "fact_list", "metadata": {"position": position, "size": "generated"}})
        latest[k] = (latest[k][0] + 1 if k in latest else 1, value)
    twice = [k for k, (count, _) in latest.items() if count > 1]
    once = [k for k, (count, _) in latest.items() if count == 1]
    n_restated = min(len(twice), round(questions * asked_restated))
    asked = rng.sample(twice, n_restated) + rng.sample(once, min(len(once), questions - n_restated))
    rng.shuffle(asked)
    qa = [{"question": slots[k][0].question.format(subject=slots[k][1]), "answer": latest[k][1], "category": 4,
           "evidence": []} for k in asked]
    return Conversation(f"fact_list_{seed}_{index}", memories, qa)


def generate_fact_lists(count: int, seed: int = 0, **sizes) -> list[Conversation]:
    return [generate_fact_list(index, seed=seed, **sizes) for index in range(count)]
