"""A synthetic knowledge base and the questions asked about it, generated from a seeded RNG.

Every task is a small world of fictional people, towns and companies with made-up
numbers, written as short documents, plus distractor documents (other entities, some
with near-identical names). A question needs ``hops`` documents: it names one or two
values (an attribute of an entity, possibly reached through relations such as "the
hometown of X") combined by arithmetic. Nothing about it can be known from memory.

The task is a plain JSON dict that carries its documents, the question, the answer and
the ``plan`` an expert follows (which names to look up, level by level, and the
calculator expression), so ``reset(options={"task": task})`` replays it exactly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_HOPS = 4

# kind -> attribute -> (low, high) inclusive, and how documents and questions say it.
ATTRIBUTES: dict[str, dict[str, tuple[int, int]]] = {
    "town": {"population": (1_000, 99_999), "founded": (1700, 1990), "elevation": (10, 2_999)},
    "person": {"age": (18, 90), "height": (150, 199)},
    "company": {"employees": (10, 9_999), "founded": (1850, 2015)},
}
ATTRIBUTE_LABELS = {"population": "Population", "founded": "Founded", "elevation": "Elevation", "age": "Age",
                    "height": "Height", "employees": "Employees"}
ATTRIBUTE_UNITS = {"elevation": " m", "height": " cm"}
ATTRIBUTE_PHRASES = {"population": "the population of {}", "founded": "the founding year of {}",
                     "elevation": "the elevation of {}", "age": "the age of {}", "height": "the height of {}",
                     "employees": "the employee count of {}"}

# kind -> relation -> kind of the entity it points to.
RELATIONS: dict[str, dict[str, str]] = {
    "person": {"hometown": "town", "employer": "company"},
    "company": {"base": "town"},
    "town": {},
}
RELATION_LABELS = {"hometown": "Hometown", "employer": "Employer", "base": "Base town"}
RELATION_PHRASES = {"hometown": "the hometown of {}", "employer": "the employer of {}", "base": "the base town of {}"}

# The relation paths a question may follow from its anchor entity.
PATHS: list[tuple[str, tuple[str, ...]]] = [
    ("person", ()), ("person", ("hometown",)), ("person", ("employer",)), ("person", ("employer", "base")),
    ("company", ()), ("company", ("base",)), ("town", ()),
]

_CONSONANTS = list("bdfgklmnprstvz")
_VOWELS = list("aeiou")
_TOWN_ENDINGS = ["ford", "ton", "vale", "mora", "dale", "wick", "holm", "by"]
_COMPANY_SUFFIXES = ["Works", "Labs", "Foods", "Mills", "Motors", "Textiles", "Freight", "Optics"]
_TOWN_PREFIXES = ["North", "South", "East", "West", "New", "Old", "Upper", "Lower"]


@dataclass
class Entity:
    """One fictional entity: its name, kind, numeric attributes and relations (names of other entities)."""

    name: str
    kind: str
    values: dict[str, int] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        """The entity's document text, e.g. ``Velmora is a town. Population: 48210. Founded: 1873. ...``."""
        parts = [f"{self.name} is a {self.kind}."]
        parts += [f"{ATTRIBUTE_LABELS[a]}: {v}{ATTRIBUTE_UNITS.get(a, '')}." for a, v in self.values.items()]
        parts += [f"{RELATION_LABELS[r]}: {self.links[r]}." for r in RELATIONS[self.kind] if r in self.links]
        return " ".join(parts)


@dataclass
class Term:
    """A value the question refers to: ``attribute`` of the entity reached from ``chain[0]`` along relations."""

    chain: list[Entity]
    relations: tuple[str, ...]
    attribute: str

    @property
    def value(self) -> int:
        return self.chain[-1].values[self.attribute]

    def phrase(self) -> str:
        subject = self.chain[0].name
        for relation in self.relations:
            subject = RELATION_PHRASES[relation].format(subject)
        return ATTRIBUTE_PHRASES[self.attribute].format(subject)


class _Namer:
    """Fresh fictional names, never the same twice within one knowledge base."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.used: set[str] = set()

    def _syllable(self) -> str:
        return str(self.rng.choice(_CONSONANTS)) + str(self.rng.choice(_VOWELS))

    def _word(self, syllables: int) -> str:
        return "".join(self._syllable() for _ in range(syllables)).capitalize()

    def _unique(self, make) -> str:
        for _ in range(1000):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("could not find an unused name")  # pragma: no cover - 14*5 syllables make this unreachable

    def fresh(self, kind: str) -> str:
        if kind == "town":
            return self._unique(lambda: self._word(int(self.rng.integers(1, 3))) + str(self.rng.choice(_TOWN_ENDINGS)))
        if kind == "company":
            return self._unique(lambda: f"{self._word(2)} {self.rng.choice(_COMPANY_SUFFIXES)}")
        return self._unique(lambda: f"{self._word(2)} {self._word(2)}{self.rng.choice(_CONSONANTS)}".title())

    def near(self, entity: Entity) -> str:
        """A name that shares a word with ``entity``'s, to make searching for it harder."""
        words = entity.name.split()
        if entity.kind == "town":
            return self._unique(lambda: f"{self.rng.choice(_TOWN_PREFIXES)} {entity.name}")
        if entity.kind == "company":
            return self._unique(lambda: f"{words[0]} {self.rng.choice(_COMPANY_SUFFIXES)}")
        return self._unique(lambda: f"{self._word(2)} {words[-1]}")


class _World:
    """Builds entities with random values; relations point at other entities of the world."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.namer = _Namer(rng)
        self.entities: list[Entity] = []

    def entity(self, kind: str, name: str | None = None) -> Entity:
        values = {a: int(self.rng.integers(lo, hi + 1)) for a, (lo, hi) in ATTRIBUTES[kind].items()}
        made = Entity(name or self.namer.fresh(kind), kind, values)
        self.entities.append(made)
        return made

    def chain(self, kind: str, relations: tuple[str, ...], start: Entity | None = None) -> list[Entity]:
        """Entities along ``relations`` from an anchor of ``kind`` (reusing ``start``'s chain where given)."""
        chain = [start or self.entity(kind)]
        for relation in relations:
            current = chain[-1]
            if relation not in current.links:
                target = self.entity(RELATIONS[current.kind][relation])
                current.links[relation] = target.name
            chain.append(self.named(current.links[relation]))
        return chain

    def named(self, name: str) -> Entity:
        return next(e for e in self.entities if e.name == name)

    def fill_links(self, entities: list[Entity]) -> None:
        """Give every entity all its relations, pointing at existing entities where possible."""
        for entity in entities:
            for relation, kind in RELATIONS[entity.kind].items():
                if relation in entity.links:
                    continue
                candidates = [e.name for e in self.entities if e.kind == kind]
                entity.links[relation] = (str(self.rng.choice(candidates)) if candidates
                                          else self.namer.fresh(kind))  # a name with no document of its own


def _shapes(hops: int) -> list[tuple]:
    """Question shapes needing exactly ``hops`` documents: one term plus a constant, or two terms."""
    shapes: list[tuple] = [("one", kind, rels) for kind, rels in PATHS if len(rels) + 1 == hops]
    for i, (kind_a, rels_a) in enumerate(PATHS):
        for kind_b, rels_b in PATHS[i:]:
            if len(rels_a) + len(rels_b) + 2 == hops:
                shapes.append(("two", kind_a, rels_a, kind_b, rels_b, False))
            if kind_a == kind_b and not (rels_a == rels_b and rels_a):  # the same chain twice reads badly
                shared = 1 + sum(1 for _ in _common_prefix(rels_a, rels_b))
                if len(rels_a) + len(rels_b) + 2 - shared == hops:
                    shapes.append(("two", kind_a, rels_a, kind_b, rels_b, True))
    return shapes


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]):
    for x, y in zip(a, b, strict=False):
        if x != y:
            return
        yield x


def _pick_attribute(world: _World, entity: Entity, avoid: str | None = None) -> str:
    options = [a for a in ATTRIBUTES[entity.kind] if a != avoid]
    return str(world.rng.choice(options))


def generate_task(rng: np.random.Generator, hops: int = 2, distractors: int = 4) -> dict[str, Any]:
    """One task: documents, a question needing ``hops`` of them, the answer, and the expert's plan."""
    if not 1 <= hops <= MAX_HOPS:
        raise ValueError(f"hops must be between 1 and {MAX_HOPS}, got {hops}")
    if distractors < 0:
        raise ValueError(f"distractors must be 0 or more, got {distractors}")
    world = _World(rng)
    shapes = _shapes(hops)
    shape = shapes[int(rng.integers(len(shapes)))]
    if shape[0] == "one":
        _, kind, rels = shape
        chain = world.chain(kind, rels)
        terms = [Term(chain, rels, _pick_attribute(world, chain[-1]))]
    else:
        _, kind_a, rels_a, kind_b, rels_b, same_anchor = shape
        chain_a = world.chain(kind_a, rels_a)
        chain_b = world.chain(kind_b, rels_b, start=chain_a[0] if same_anchor else None)
        attribute_a = _pick_attribute(world, chain_a[-1])
        same_end = chain_b[-1] is chain_a[-1]
        if same_end and len(ATTRIBUTES[chain_a[-1].kind]) < 2:  # pragma: no cover - every kind has two or more
            raise RuntimeError("cannot ask two different values of one entity")
        attribute_b = _pick_attribute(world, chain_b[-1], avoid=attribute_a if same_end else None)
        terms = [Term(chain_a, rels_a, attribute_a), Term(chain_b, rels_b, attribute_b)]
    needed = list(dict.fromkeys(e.name for t in terms for e in t.chain))
    question, expression, answer = _arithmetic(rng, terms)

    needed_entities = [world.named(n) for n in needed]
    for index in range(distractors):
        if index % 2 == 0:  # every other distractor has a name close to one the question needs
            model = needed_entities[int(rng.integers(len(needed_entities)))]
            world.entity(model.kind, world.namer.near(model))
        else:
            world.entity(str(rng.choice(list(ATTRIBUTES))))
    world.fill_links(world.entities)

    order = rng.permutation(len(world.entities))
    ids = {world.entities[i].name: f"d{rank + 1:02d}" for rank, i in enumerate(order)}
    documents = [{"id": ids[e.name], "title": e.name, "text": e.text()}
                 for e in sorted(world.entities, key=lambda e: ids[e.name])]
    levels: list[list[dict[str, str]]] = []
    for depth in range(max(len(t.chain) for t in terms)):
        names = dict.fromkeys(t.chain[depth].name for t in terms if depth < len(t.chain))
        fresh = [n for n in names if not any(n == item["name"] for level in levels for item in level)]
        if fresh:
            levels.append([{"name": n, "doc_id": ids[n]} for n in fresh])
    digest = hashlib.sha1(f"{question}|{answer}|{len(documents)}".encode()).hexdigest()[:10]
    return {
        "task_id": f"tooluse-{digest}",
        "question": question,
        "answer": str(answer),
        "documents": documents,
        "hops": hops,
        "distractors": distractors,
        "plan": {"lookups": levels, "expression": expression},
    }


def _arithmetic(rng: np.random.Generator, terms: list[Term]) -> tuple[str, str, int]:
    """Combine the terms' values: two terms are added or subtracted, one term meets a constant."""
    if len(terms) == 2:
        a, b = terms
        if rng.random() < 0.5:
            return f"What is {a.phrase()} plus {b.phrase()}?", f"{a.value} + {b.value}", a.value + b.value
        if a.value < b.value:
            a, b = b, a
        return f"What is {a.phrase()} minus {b.phrase()}?", f"{a.value} - {b.value}", a.value - b.value
    (term,) = terms
    kind = int(rng.integers(3))
    if kind == 0:
        k = int(rng.integers(2, 10))
        return f"What is {term.phrase()} times {k}?", f"{term.value} * {k}", term.value * k
    k = int(rng.integers(1, min(term.value, 1000)))
    if kind == 1:
        return f"What is {term.phrase()} plus {k}?", f"{term.value} + {k}", term.value + k
    return f"What is {term.phrase()} minus {k}?", f"{term.value} - {k}", term.value - k
