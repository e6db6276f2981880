"""ReAct agent: a two-hop question about generated facts, two worked examples (the shared
prefix), then six Thought/Action steps.  Each step is a gen stopped at "Observation"; the
program parses its ``Action: Tool[argument]`` and appends the observation of a fake,
deterministic tool (``Search``/``Lookup`` over passages of ``data.world``, ``Finish``), so the
context grows step by step.  Always six steps, no early exit: the work is fixed."""
from __future__ import annotations

import random
import re

from benchmarks.programs.data import city_passage, person_passage, world
from benchmarks.programs.spec import Workload, scaled, variables
from frontend_lang import function, gen

STEPS = 6
INTRO = ("Solve a question answering task with interleaving Thought, Action, Observation steps. Thought can "
         "reason about the current situation, and Action can be three types:\n"
         "(1) Search[entity], which returns the first sentences of the entity's page if it exists. If not, it "
         "returns some similar entities to search.\n"
         "(2) Lookup[keyword], which returns the next sentence containing keyword in the last page searched.\n"
         "(3) Finish[answer], which returns the answer and finishes the task.\n"
         "Here are some examples.\n\n")
ACTION = re.compile(r"Action(?: \d+)?:\s*(Search|Lookup|Finish)\[([^\]\n]*)\]")
ASKS = [("What is the population of the city where {p} lives?", "population", lambda c: f"{c.population:,}"),
        ("Who is the mayor of the city where {p} lives?", "mayor", lambda c: c.mayor),
        ("Which river flows through the city where {p} lives?", "river", lambda c: c.river),
        ("In which year was the city where {p} lives founded?", "founded", lambda c: str(c.founded))]


def page(text: str, sentences: int = 4) -> str:
    return " ".join(re.split(r"(?<=\.) ", text)[:sentences])


def tool(step: str, kb: dict[str, str], last: list[str]) -> str:
    """The observation for the step's action (``last`` holds the page searched last)."""
    m = ACTION.search(step)
    if m is None:
        return "Invalid action. Valid actions are Search[<entity>], Lookup[<keyword>] and Finish[<answer>]."
    kind, arg = m.group(1), m.group(2).strip()
    if kind == "Finish":
        return f"Answer submitted: {arg}. Check it once more against the observations."
    if kind == "Lookup":
        hits = [x for x in re.split(r"(?<=\.) ", kb.get(last[0], "")) if arg and arg.lower() in x.lower()]
        return hits[0] if hits else "No more results."
    key = next((k for k in kb if k.lower() == arg.lower()), None)
    key = key or next((k for k in kb if arg and (arg.lower() in k.lower() or k.lower() in arg.lower())), None)
    if key is None:
        similar = sorted(kb, key=lambda k: (-len(set(k.lower()) & set(arg.lower())), k))[:3]
        return f"Could not find [{arg}]. Similar: {similar}."
    last[:] = [key]
    return page(kb[key])


def example(w, p, ask) -> str:
    q, field, value = ask
    c = next(c for c in w.cities if c.name == p.city)
    return (f"Question: {q.format(p=p.name)}\n"
            f"Thought 1: I need to find the city where {p.name} lives, then the {field} of that city.\n"
            f"Action 1: Search[{p.name}]\nObservation 1: {page(person_passage(p))}\n"
            f"Thought 2: {p.name} lives in {c.name}. Now I need to search {c.name} and find its {field}.\n"
            f"Action 2: Search[{c.name}]\nObservation 2: {page(city_passage(c))}\n"
            f"Thought 3: The {field} of {c.name} is {value(c)}, so the answer is {value(c)}.\n"
            f"Action 3: Finish[{value(c)}]\nObservation 3: Answer submitted: {value(c)}.\n\n")


@function
def react_agent(s, examples: str, question: str, kb: dict[str, str], step_tokens: int):
    s += INTRO + examples + f"Question: {question}\n"
    last = [""]
    for i in range(1, STEPS + 1):
        s += f"Thought {i}:" + gen(f"step_{i}", max_tokens=step_tokens, stop="Observation")
        step = s[f"step_{i}"]
        s += ("" if step.endswith("\n") else "\n") + f"Observation {i}: {tool(step, kb, last)}\n"


def make(n: int, seed: int = 0, *, scale: float = 1.0) -> Workload:
    w = world(seed)
    rng = random.Random(f"react-{seed}")
    kb = {p.name: person_passage(p) for p in w.people} | {c.name: city_passage(c) for c in w.cities}
    people = rng.sample(w.people, len(w.people))
    examples = "".join(example(w, people[-1 - i], ASKS[i]) for i in range(scaled(2, scale, least=0)))
    args = [{"examples": examples, "question": ASKS[i % len(ASKS)][0].format(p=people[i % (len(people) - 2)].name),
             "kb": kb, "step_tokens": scaled(64, scale)} for i in range(n)]
    return Workload("react_agent", react_agent, args, frozenset({"gen", "stop"}),
                    variables(*(f"step_{i}" for i in range(1, STEPS + 1))),
                    description=f"ReAct over generated facts: 2 examples, {STEPS} Thought/Action gens "
                                "(stop at Observation) with a fake deterministic tool")
