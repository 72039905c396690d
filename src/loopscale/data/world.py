"""The task world: a seeded, offline stand-in for the paper's five downstream axes (arXiv 2604.21106 §6).

``build_world(cfg, train_bytes=..., val_bytes=...)`` returns training documents (strings mixed into the
training stream), held-out validation documents, and evaluation items, each a prompt with a gold continuation::

    knowledge  bio_qa            closed-book questions about people whose biographies are in training
               bio_qa_unseen     the same questions about people who never appear (control, not scored)
    reading    passage_qa        a fresh passage, a question answerable only from it
               story_cloze       a fresh story whose last word is a name from the story (Lambada-like)
    math       arith_word        one- and two-step arithmetic word problems, numeric answer
    reasoning  induction         8 random key->value pairs, look one up
               varassign_d{0,1}_{math,code}   5 variables with values 1-25; depth 1 adds aliases
    symbolic   dyck              close an open bracket sequence
               string_compose    apply 1-3 string operations to a random word

Guarantees (tested): the same seed gives byte-identical output on every platform (only
``random.Random`` seeded with strings, and no iteration over sets or dicts built from hashes);
no evaluation item of the reading, math, reasoning or symbolic axes is generated for training or
validation (items are rejected by their identifying text), so no eval prompt+gold occurs in the
training stream; every ``bio_qa`` fact is stated in training (in biographies and in Q&A with
*other* question wordings), and no ``bio_qa_unseen`` person is ever named in training.

Scoring convention: the loss of ``gold`` given ``prompt``; ``prompt + gold`` is the full text and
``gold`` starts with a space (``" Lyon"``), as lm-eval does. Axis score = macro average over the
axis's tasks, excluding ``CONTROL_TASKS``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from loopscale.config.data import AXES, DataConfig
from loopscale.errors import ConfigError

# ---- task registry ---------------------------------------------------------------------------

TASKS: dict[str, str] = {
    "bio_qa": "knowledge",
    "bio_qa_unseen": "knowledge",
    "passage_qa": "reading",
    "story_cloze": "reading",
    "arith_word": "math",
    "induction": "reasoning",
    "varassign_d0_math": "reasoning",
    "varassign_d1_math": "reasoning",
    "varassign_d0_code": "reasoning",
    "varassign_d1_code": "reasoning",
    "dyck": "symbolic",
    "string_compose": "symbolic",
}
"""Every evaluation task and its axis, in report order."""

CONTROL_TASKS: tuple[str, ...] = ("bio_qa_unseen",)
"""Tasks that are controls, not part of an axis score (seen-vs-unseen knowledge gap)."""

N_SHOTS = 8  # training-distribution examples kept per task for few-shot prompts


@dataclass(frozen=True)
class EvalItem:
    """One evaluation item: score the loss of ``gold`` after ``prompt``.

    ``choices`` (when given) are alternative continuations, gold among them, for accuracy by
    lowest loss; ``meta`` says what the item tests (entity, attribute, template, depth, ...).
    """

    task: str
    axis: str
    prompt: str
    gold: str
    choices: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def text(self) -> str:
        return self.prompt + self.gold


@dataclass(frozen=True)
class Entity:
    """A person of the world, with the five attributes the knowledge axis asks about."""

    name: str
    pronoun: str  # "he" / "she"
    birth_year: str
    city: str
    employer: str
    field: str
    instrument: str

    def value(self, attribute: str) -> str:
        return str(getattr(self, attribute))


ATTRIBUTES: tuple[str, ...] = ("birth_year", "city", "employer", "field", "instrument")


@dataclass
class World:
    """Generated text and items. ``train_docs[i]`` belongs to family ``train_family[i]``."""

    entities: list[Entity]
    unseen_entities: list[Entity]
    train_docs: list[str]
    train_family: list[str]
    val_docs: list[str]
    val_family: list[str]
    eval_items: list[EvalItem]
    shots: dict[str, list[EvalItem]]  # per task: items in eval format drawn from training text

    def items(self, task: str) -> list[EvalItem]:
        return [it for it in self.eval_items if it.task == task]


# ---- vocabularies ------------------------------------------------------------------------------

FEMALE = (
    "Ada",
    "Bea",
    "Cora",
    "Dina",
    "Elsa",
    "Fern",
    "Gwen",
    "Hana",
    "Ida",
    "Jana",
    "Kira",
    "Lena",
    "Mara",
    "Nora",
    "Orla",
    "Pia",
    "Rosa",
    "Sara",
    "Tess",
    "Uma",
    "Vera",
    "Wren",
    "Yara",
    "Zoe",
    "Alma",
    "Bree",
    "Cleo",
    "Dora",
    "Edie",
    "Faye",
    "Greta",
    "Hilda",
    "Iris",
    "June",
    "Kaya",
    "Lina",
    "Mina",
    "Nell",
    "Opal",
    "Paula",
    "Ruth",
    "Selma",
    "Thea",
    "Una",
    "Vida",
)
MALE = (
    "Abe",
    "Bram",
    "Cal",
    "Dev",
    "Emil",
    "Finn",
    "Gus",
    "Hugo",
    "Ivo",
    "Jude",
    "Kai",
    "Leon",
    "Milo",
    "Nils",
    "Otto",
    "Pavel",
    "Quinn",
    "Rafe",
    "Saul",
    "Theo",
    "Ugo",
    "Vik",
    "Wade",
    "Xavi",
    "Yuri",
    "Zane",
    "Arlo",
    "Boris",
    "Cyril",
    "Dario",
    "Ezra",
    "Felix",
    "Gil",
    "Hector",
    "Igor",
    "Joel",
    "Karl",
    "Luca",
    "Marek",
    "Noel",
    "Oskar",
    "Pablo",
    "Rolf",
    "Sven",
    "Tomas",
)
SURNAMES = (
    "Abbot",
    "Barrow",
    "Castell",
    "Dunmore",
    "Eskew",
    "Farrow",
    "Garnet",
    "Holm",
    "Ibsen",
    "Jarvik",
    "Kessel",
    "Lindqvist",
    "Marlow",
    "Nettle",
    "Orwin",
    "Pellam",
    "Quill",
    "Rasmus",
    "Sorrel",
    "Tamsin",
    "Ulric",
    "Varga",
    "Wexley",
    "Yarrow",
    "Zeller",
    "Ashby",
    "Bexley",
    "Corwin",
    "Dalby",
    "Elmore",
    "Fenwick",
    "Gorski",
    "Hadley",
    "Imrie",
    "Jessup",
    "Kovac",
    "Lyle",
    "Mercer",
    "Novak",
    "Oakes",
    "Pruitt",
    "Rhodes",
    "Saxby",
    "Thorne",
    "Upton",
    "Vance",
    "Whitlow",
    "Yeats",
    "Zorn",
    "Alder",
    "Brandt",
    "Crane",
    "Drury",
    "Ellery",
    "Fiske",
    "Grady",
    "Hollis",
    "Ivers",
    "Jansen",
    "Keane",
    "Lockett",
    "Mayhew",
    "Norris",
    "Ormond",
    "Parrish",
    "Redfern",
    "Sutter",
    "Tolliver",
    "Vickers",
    "Wolcott",
    "Bristow",
    "Calloway",
    "Delacroix",
    "Everly",
    "Fairbanks",
    "Gilchrist",
    "Hargrove",
    "Kincaid",
    "Larkspur",
    "Merriweather",
    "Northcott",
    "Pemberton",
    "Quimby",
    "Rutherford",
    "Stanhope",
    "Thistlewood",
    "Underhill",
    "Winslow",
    "Ashcombe",
    "Blackwood",
)
CITIES = (
    "Lisbon",
    "Oslo",
    "Cairo",
    "Lima",
    "Quito",
    "Dublin",
    "Vienna",
    "Prague",
    "Nairobi",
    "Hanoi",
    "Seoul",
    "Osaka",
    "Lagos",
    "Havana",
    "Krakow",
    "Porto",
    "Tunis",
    "Bergen",
    "Tallinn",
    "Riga",
    "Zagreb",
    "Bogota",
    "Denver",
    "Halifax",
    "Perth",
    "Auckland",
    "Manila",
    "Dakar",
    "Accra",
    "Minsk",
    "Turin",
    "Seville",
    "Lyon",
    "Ghent",
    "Malmo",
    "Tampere",
    "Cork",
    "Bilbao",
    "Split",
    "Leipzig",
)
EMPLOYERS = (
    "Northwind Freight",
    "Bluestone Bank",
    "Harbor Lights",
    "Copperleaf Labs",
    "Silverline Rail",
    "Oakridge Mills",
    "Redwater Energy",
    "Greyfield Press",
    "Sunmoor Farms",
    "Ironbridge Works",
    "Clearbrook Health",
    "Stormhaven Shipping",
    "Tidewell Foods",
    "Brightforge Tools",
    "Westgate Insurance",
    "Highpeak Software",
    "Lakeside Textiles",
    "Foxglove Pharma",
    "Marbleton Glass",
    "Quartzline Optics",
    "Amberfield Mining",
    "Kestrel Aviation",
    "Willowmere Hotels",
    "Pinecrest Paper",
    "Coldspring Water",
    "Thornbury Motors",
    "Goldcrest Media",
    "Saltmarsh Fisheries",
    "Riverbend Robotics",
    "Elmstead Ceramics",
)
FIELDS = (
    "botany",
    "geology",
    "chemistry",
    "astronomy",
    "linguistics",
    "economics",
    "zoology",
    "optics",
    "topology",
    "acoustics",
    "genetics",
    "meteorology",
    "archaeology",
    "cryptography",
    "ecology",
    "metallurgy",
    "oceanography",
    "philosophy",
    "statistics",
    "virology",
    "mycology",
    "robotics",
    "cartography",
    "hydrology",
)
INSTRUMENTS = (
    "cello",
    "oboe",
    "violin",
    "harp",
    "flute",
    "banjo",
    "trumpet",
    "clarinet",
    "piano",
    "viola",
    "bassoon",
    "ukulele",
    "accordion",
    "trombone",
    "mandolin",
    "harmonica",
)
YEARS = tuple(str(y) for y in range(1920, 2000))
VALUES: dict[str, tuple[str, ...]] = {
    "birth_year": YEARS,
    "city": CITIES,
    "employer": EMPLOYERS,
    "field": FIELDS,
    "instrument": INSTRUMENTS,
}

TOWN_A = (
    "Brack",
    "Wyn",
    "Hollow",
    "Marsh",
    "Elder",
    "Stone",
    "Ash",
    "Fen",
    "Raven",
    "Thorn",
    "Cold",
    "Bram",
    "Kings",
    "Wolf",
    "Gull",
    "Oxen",
    "Pike",
    "Rush",
    "Sedge",
    "Tarn",
)
TOWN_B = (
    "well",
    "ford",
    "mere",
    "by",
    "wick",
    "stead",
    "ton",
    "holm",
    "dale",
    "moor",
    "bridge",
    "combe",
    "haven",
    "field",
    "gate",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "grey", "black", "white", "brown")
GOODS = ("apples", "barrels", "candles", "blankets", "lanterns", "baskets", "ropes", "jars", "boots", "books")
ITEMS = ("lamp", "cloak", "kettle", "drum", "saddle", "compass", "umbrella", "chest", "scarf", "bell")
SHOPS = ("bakery", "forge", "bookshop", "tailor's shop", "pottery", "bicycle shop", "flower shop", "inn")
MATERIALS = (
    "sacks of flour",
    "bars of iron",
    "bolts of cloth",
    "loads of clay",
    "crates of paper",
    "boxes of nails",
    "bags of seed",
)
ANIMALS = ("goat", "parrot", "horse", "cat", "dog", "donkey", "owl", "tortoise")
FESTIVALS = ("harvest fair", "spring festival", "river regatta", "lantern festival", "winter market")
CONTESTS = ("pie contest", "archery match", "rowing race", "chess tournament", "singing contest")
PLACES = ("cottage", "workshop", "boat", "flat", "farmhouse", "studio")
FURNITURE = ("bed", "table", "sofa", "stairs", "cupboard", "rug")
FOODS = ("loaves", "pies", "cakes", "buns", "tarts")
OBJECTS = (
    "apples",
    "marbles",
    "stamps",
    "pencils",
    "cards",
    "shells",
    "coins",
    "books",
    "eggs",
    "stickers",
    "buttons",
    "candles",
)
BRACKETS = (("(", ")"), ("[", "]"), ("{", "}"), ("<", ">"))
LETTERS = "abcdefghijklmnopqrstuvwxyz"

# ---- knowledge: biographies, Q&A in training wordings, eval in held-out wordings -----------------
# {S}/{s}: subject at/after sentence start; {P}/{p}: possessive. For the full name all four are
# "Name" / "Name's"; for a pronoun they are She/she/Her/her.
BIO_TEMPLATES: dict[str, tuple[str, ...]] = {
    "birth_year": (
        "{S} was born in {v}.",
        "{S} was born in the year {v}.",
        "{P} birth year is {v}.",
        "In {v}, {s} was born.",
    ),
    "city": (
        "{S} grew up in {v}.",
        "{P} hometown is {v}.",
        "{S} is a native of {v}.",
        "{S} comes from the city of {v}.",
    ),
    "employer": (
        "{S} works for {v}.",
        "{S} is employed by {v}.",
        "{S} has a job at {v}.",
        "These days {s} works at {v}.",
    ),
    "field": ("{S} studied {v}.", "{S} is an expert in {v}.", "{S} trained in {v} at university.", "{P} field is {v}."),
    "instrument": (
        "{S} plays the {v}.",
        "In {p} spare time, {s} plays the {v}.",
        "{S} learned to play the {v} as a child.",
        "{S} is a keen {v} player.",
    ),
}
TRAIN_QUESTIONS: dict[str, tuple[str, ...]] = {
    "birth_year": ("When was {n} born?",),
    "city": ("Where did {n} grow up?",),
    "employer": ("Who does {n} work for?",),
    "field": ("What did {n} study?",),
    "instrument": ("What instrument does {n} play?",),
}
EVAL_QUESTIONS: dict[str, tuple[str, ...]] = {
    "birth_year": ("In what year was {n} born?", "What is the birth year of {n}?"),
    "city": ("Which city is {n} from?", "What is the hometown of {n}?"),
    "employer": ("Which company employs {n}?", "Where does {n} work?"),
    "field": ("What subject did {n} study?", "In which field is {n} an expert?"),
    "instrument": ("Which instrument does {n} play?", "What musical instrument does {n} play?"),
}


def _population(rng: random.Random, n: int) -> list[Entity]:
    people = [(f, "she") for f in FEMALE] + [(m, "he") for m in MALE]
    names = [(f"{first} {last}", pron) for first, pron in people for last in SURNAMES]
    if n > len(names):
        raise ConfigError("data.world", f"n_entities + n_unseen_entities must be at most {len(names)}", value=n)
    chosen = rng.sample(names, n)
    return [
        Entity(
            name,
            pron,
            rng.choice(YEARS),
            rng.choice(CITIES),
            rng.choice(EMPLOYERS),
            rng.choice(FIELDS),
            rng.choice(INSTRUMENTS),
        )
        for name, pron in chosen
    ]


def _refs(e: Entity, use_name: bool) -> dict[str, str]:
    if use_name:
        return {"S": e.name, "s": e.name, "P": f"{e.name}'s", "p": f"{e.name}'s"}
    pron, poss = e.pronoun, ("her" if e.pronoun == "she" else "his")
    return {"S": pron.capitalize(), "s": pron, "P": poss.capitalize(), "p": poss}


def _bio(rng: random.Random, e: Entity) -> str:
    k = rng.randint(3, len(ATTRIBUTES))
    attrs = rng.sample(ATTRIBUTES, k)
    sentences = []
    for i, a in enumerate(attrs):
        tpl = rng.choice(BIO_TEMPLATES[a])
        sentences.append(tpl.format(v=e.value(a), **_refs(e, i == 0 or rng.random() < 0.5)))
    head = rng.choice(("", "", f"About {e.name}.\n", f"{e.name}\n"))
    return head + " ".join(sentences)


def _qa_doc(rng: random.Random, e: Entity) -> str:
    attrs = rng.sample(ATTRIBUTES, rng.randint(2, 4))
    return "\n\n".join(
        f"Question: {rng.choice(TRAIN_QUESTIONS[a]).format(n=e.name)}\nAnswer: {e.value(a)}" for a in attrs
    )


def _cycle(rng: random.Random, entities: list[Entity]) -> Iterator[Entity]:
    """Every entity once per round, in a fresh seeded order each round (equal exposure)."""
    while True:
        order = list(entities)
        rng.shuffle(order)
        yield from order


def _knowledge_items(rng: random.Random, seen: list[Entity], unseen: list[Entity], n: int) -> list[EvalItem]:
    """``n`` seen-fact items and ``n`` matched unseen-fact items (same attribute and template)."""
    pools = {}
    for a in ATTRIBUTES:
        s = [(e, a) for e in seen]
        u = [(e, a) for e in unseen]
        rng.shuffle(s)
        rng.shuffle(u)
        pools[a] = (s, u)
    out_seen: list[EvalItem] = []
    out_unseen: list[EvalItem] = []
    for i in range(n):
        a = ATTRIBUTES[i % len(ATTRIBUTES)]
        j = i // len(ATTRIBUTES)
        tpl_i = rng.randrange(len(EVAL_QUESTIONS[a]))
        s, u = pools[a]
        for (e, _), task, out, is_seen in (
            (s[j % len(s)], "bio_qa", out_seen, True),
            (u[j % len(u)], "bio_qa_unseen", out_unseen, False),
        ):
            gold = e.value(a)
            distract = rng.sample([v for v in VALUES[a] if v != gold], 3)
            choices = [*distract]
            choices.insert(rng.randrange(4), gold)
            prompt = f"Question: {EVAL_QUESTIONS[a][tpl_i].format(n=e.name)}\nAnswer:"
            out.append(
                EvalItem(
                    task,
                    "knowledge",
                    prompt,
                    " " + gold,
                    tuple(" " + c for c in choices),
                    {"entity": e.name, "attribute": a, "template": tpl_i, "seen": is_seen},
                )
            )
    return out_seen + out_unseen


# ---- generated items for the other axes ----------------------------------------------------------


@dataclass(frozen=True)
class _Item:
    prompt: str
    gold: str  # with the leading space
    key: str  # identifies the item; training/validation never reuse an eval item's key
    meta: dict[str, Any]
    context: str = ""  # passage_qa: the passage, shared by several questions in a training doc


def _town(rng: random.Random) -> str:
    return rng.choice(TOWN_A) + rng.choice(TOWN_B)


def _two_names(rng: random.Random, k: int = 2) -> list[str]:
    return rng.sample(FEMALE + MALE, k)


def _pron(name: str) -> tuple[str, str]:
    return ("she", "her") if name in FEMALE else ("he", "his")


def _passage(rng: random.Random) -> tuple[str, list[tuple[str, str]], int]:
    """A short story and the questions it answers (question, answer)."""
    kind = rng.randrange(3)
    a, b, c = _two_names(rng, 3)
    t1 = _town(rng)
    t2 = _town(rng)
    while t2 == t1:
        t2 = _town(rng)
    day, color = rng.choice(DAYS), rng.choice(COLORS)
    if kind == 0:
        k, goods, item, price = rng.randint(2, 19), rng.choice(GOODS), rng.choice(ITEMS), rng.randint(3, 90)
        text = (
            f"{a} left {t1} on {day} with {k} {goods}. On the road {_pron(a)[0]} met {b}, who was "
            f"carrying a {color} {item}. They reached {t2} at dusk, and {b} sold the {item} for "
            f"{price} coins."
        )
        qs = [
            (f"Which town did {a} leave?", t1),
            (f"On which day did {a} leave {t1}?", day),
            (f"How many {goods} did {a} take?", str(k)),
            (f"Who did {a} meet on the road?", b),
            (f"What colour was the {item} that {b} carried?", color),
            ("Which town did they reach at dusk?", t2),
            (f"For how many coins did {b} sell the {item}?", str(price)),
        ]
    elif kind == 1:
        shop, k = rng.choice(SHOPS), rng.randint(2, 19)
        mat, animal = rng.choice(MATERIALS), rng.choice(ANIMALS)
        text = (
            f"{a} runs a {shop} in {t1}. Every {day}, {_pron(a)[0]} buys {k} {mat} from {b}. Last "
            f"month {a} hired {c}, who came from {t2} and owns a {color} {animal}."
        )
        qs = [
            (f"What does {a} run in {t1}?", f"a {shop}"),
            (f"Where does {a} run the {shop}?", t1),
            (f"On which day does {a} buy {mat}?", day),
            (f"How many {mat} does {a} buy?", str(k)),
            (f"Who sells {mat} to {a}?", b),
            (f"Who did {a} hire last month?", c),
            (f"Where did {c} come from?", t2),
            (f"What colour is the {animal} of {c}?", color),
            (f"What animal does {c} own?", f"a {animal}"),
        ]
    else:
        fest, contest, item = rng.choice(FESTIVALS), rng.choice(CONTESTS), rng.choice(ITEMS)
        k, crowd = rng.randint(20, 99), rng.randint(100, 900)
        text = (
            f"The {fest} of {t1} began on {day}. {a} won the {contest} with a score of {k}, and {b} "
            f"came second. The prize was a {color} {item}, and {crowd} people came to watch."
        )
        qs = [
            (f"Where was the {fest} held?", t1),
            (f"On which day did the {fest} begin?", day),
            (f"Who won the {contest}?", a),
            (f"Who came second in the {contest}?", b),
            (f"What was the winning score in the {contest}?", str(k)),
            ("What colour was the prize?", color),
            ("How many people came to watch?", str(crowd)),
        ]
    return text, qs, kind


def _passage_qa(rng: random.Random) -> _Item:
    text, qs, kind = _passage(rng)
    qi = rng.randrange(len(qs))
    q, a = qs[qi]
    return _Item(
        f"Passage: {text}\nQuestion: {q}\nAnswer:", " " + a, text, {"story": kind, "question": qi}, context=text
    )


def _passage_doc(rng: random.Random, forbidden: set[str]) -> tuple[str, list[_Item]]:
    while True:
        text, qs, kind = _passage(rng)
        if text not in forbidden:
            break
    chosen = rng.sample(range(len(qs)), rng.randint(1, 3))
    lines = [f"Passage: {text}"] + [f"Question: {qs[i][0]}\nAnswer: {qs[i][1]}" for i in chosen]
    items = [
        _Item(f"Passage: {text}\nQuestion: {qs[i][0]}\nAnswer:", " " + qs[i][1], text, {"story": kind, "question": i})
        for i in chosen[:1]
    ]
    return "\n".join(lines), items


def _story_cloze(rng: random.Random) -> _Item:
    kind = rng.randrange(6)
    a, b = _two_names(rng)
    town, day, k = _town(rng), rng.choice(DAYS), rng.randint(2, 12)
    pa, qa = _pron(a)
    pb, _ = _pron(b)
    item, place = rng.choice(ITEMS), rng.choice(PLACES)
    if kind == 0:
        text = (
            f"{a} and {b} shared a {place} in {town}. One {day} morning {a} lost {qa} {item}. {b} "
            f"searched everywhere and found it under the {rng.choice(FURNITURE)}. That evening {b} "
            f"gave the {item} back to"
        )
        gold = a
    elif kind == 1:
        text = (
            f"{a} lent {b} a {rng.choice(COLORS)} {item} before the trip to {town}. The trip was long, "
            f"and {b} used the {item} every day. When the trip was over, {b} returned the {item} to"
        )
        gold = a
    elif kind == 2:
        text = (
            f"{a} wrote a letter to {b}, who lived in {town}. The letter took {k} days to arrive. When "
            f"{b} finally read it, {pb} smiled and wrote back to"
        )
        gold = a
    elif kind == 3:
        food = rng.choice(FOODS)
        text = (
            f"{a} baked {k} {food} for the fair in {town}. {b} bought all of them before noon. "
            f"Everyone at the fair asked who had baked the {food}, and {b} pointed at"
        )
        gold = a
    elif kind == 4:
        animal = rng.choice(ANIMALS)
        text = (
            f"{a} asked {b} to mind the {animal} while {pa} was away in {town}. The {animal} was "
            f"hungry, so every morning it was fed by"
        )
        gold = b
    else:
        text = (
            f"{a} lost a game of chess to {b} on {day}. Everyone in {town} talked about the winner of the game, who was"
        )
        gold = b
    return _Item(text, " " + gold, text, {"story": kind})


def _arith_word(rng: random.Random) -> _Item:
    kind = rng.randrange(6)
    a, b = _two_names(rng)
    s = _pron(a)[0].capitalize()
    obj = rng.choice(OBJECTS)
    if kind == 0:
        x, y = rng.randint(2, 40), rng.randint(2, 40)
        q, ans = f"{a} has {x} {obj}. {s} finds {y} more. How many {obj} does {a} have now?", x + y
    elif kind == 1:
        x = rng.randint(10, 60)
        y = rng.randint(1, x - 1)
        q, ans = f"{a} had {x} {obj} and gave {y} of them to {b}. How many {obj} does {a} have left?", x - y
    elif kind == 2:
        x, y = rng.randint(2, 9), rng.randint(2, 12)
        q, ans = (f"{a} buys {x} boxes of {obj}. Each box holds {y} {obj}. How many {obj} does {a} buy in all?"), x * y
    elif kind == 3:
        x, y = rng.randint(2, 12), rng.randint(2, 9)
        q, ans = (f"{a} shares {x * y} {obj} equally among {y} friends. How many {obj} does each friend get?"), x
    elif kind == 4:
        x, y = rng.randint(2, 30), rng.randint(2, 30)
        z = rng.randint(1, x + y - 1)
        q, ans = (
            (f"{a} has {x} {obj}. {s} buys {y} more and then gives {z} to {b}. How many {obj} does {a} have now?"),
            x + y - z,
        )
    else:
        x = rng.randint(5, 60)
        y = rng.randint(1, x - 1)
        q, ans = (f"{a} has {x} {obj} and {b} has {y} {obj}. How many more {obj} does {a} have than {b}?"), x - y
    prompt = f"Question: {q}\nAnswer:"
    return _Item(prompt, f" {ans}", prompt, {"kind": kind})


def _induction(rng: random.Random) -> _Item:
    keys: list[str] = []
    while len(keys) < 8:
        k = "".join(rng.choice(LETTERS) for _ in range(3))
        if k not in keys:
            keys.append(k)
    vals = [str(rng.randint(10, 99)) for _ in keys]
    qi = rng.randrange(8)
    pairs = ", ".join(f"{k} {v}" for k, v in zip(keys, vals, strict=True))
    prompt = f"Pairs: {pairs}\nLookup: {keys[qi]}\nValue:"
    return _Item(prompt, " " + vals[qi], prompt, {"position": qi})


def _varassign(depth: int, style: str) -> Callable[[random.Random], _Item]:
    def gen(rng: random.Random) -> _Item:
        names = rng.sample(LETTERS, 10)
        base, alias = names[:5], names[5:]
        values = [rng.randint(1, 25) for _ in base]
        lines = [f"{n} = {v}" for n, v in zip(base, values, strict=True)]
        if depth == 1:
            targets = [rng.randrange(5) for _ in alias]
            lines += [f"{n} = {base[t]}" for n, t in zip(alias, targets, strict=True)]
            qi = rng.randrange(5)
            query, ans = alias[qi], values[targets[qi]]
        else:
            qi = rng.randrange(5)
            query, ans = base[qi], values[qi]
        if style == "math":
            prompt = f"Let {', '.join(lines)}. What is {query}?\nAnswer:"
        else:
            prompt = "\n".join(lines) + f"\nprint({query})\n# output:"
        return _Item(prompt, f" {ans}", prompt, {"depth": depth, "style": style})

    return gen


def _dyck(rng: random.Random) -> _Item:
    n = rng.randint(4, 14)
    seq: list[str] = []
    stack: list[int] = []
    for _ in range(n):
        if stack and (rng.random() < 0.45):
            seq.append(BRACKETS[stack.pop()][1])
        else:
            b = rng.randrange(len(BRACKETS))
            stack.append(b)
            seq.append(BRACKETS[b][0])
    if not stack:
        b = rng.randrange(len(BRACKETS))
        stack.append(b)
        seq.append(BRACKETS[b][0])
    closing = " ".join(BRACKETS[b][1] for b in reversed(stack))
    prompt = f"Close the brackets: {' '.join(seq)}\nAnswer:"
    return _Item(prompt, " " + closing, prompt, {"open": len(stack), "length": len(seq)})


_STRING_OPS: dict[str, Callable[[str], str]] = {
    "reverse": lambda w: w[::-1],
    "upper": str.upper,
    "sort": lambda w: "".join(sorted(w)),
    "double": lambda w: "".join(c + c for c in w),
    "rotate": lambda w: w[1:] + w[:1],
}


def _string_compose(rng: random.Random) -> _Item:
    word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6)))
    ops = [rng.choice(list(_STRING_OPS)) for _ in range(rng.randint(1, 3))]
    out = word
    for op in ops:
        out = _STRING_OPS[op](out)
    prompt = f"Word: {word}\nSteps: {', '.join(ops)}\nAnswer:"
    return _Item(prompt, " " + out, prompt, {"steps": len(ops)})


GENERATORS: dict[str, Callable[[random.Random], _Item]] = {
    "passage_qa": _passage_qa,
    "story_cloze": _story_cloze,
    "arith_word": _arith_word,
    "induction": _induction,
    "varassign_d0_math": _varassign(0, "math"),
    "varassign_d1_math": _varassign(1, "math"),
    "varassign_d0_code": _varassign(0, "code"),
    "varassign_d1_code": _varassign(1, "code"),
    "dyck": _dyck,
    "string_compose": _string_compose,
}
"""Generators of the non-knowledge tasks (one item per call)."""


# ---- assembly ----------------------------------------------------------------------------------


def _rng(seed: int, *parts: str) -> random.Random:
    # String seeds go through sha512 (random's version-2 seeding): platform independent and
    # unaffected by PYTHONHASHSEED.
    return random.Random(":".join(["loopscale.world", str(seed), *parts]))


def _eval_items(seed: int, task: str, n: int) -> tuple[list[EvalItem], set[str]]:
    rng = _rng(seed, "eval", task)
    gen = GENERATORS[task]
    items: list[EvalItem] = []
    keys: set[str] = set()
    tries = 0
    while len(items) < n:
        it = gen(rng)
        tries += 1
        if it.key in keys:
            if tries > 50 * n:
                raise ConfigError("data.world.eval_per_task", f"too many for task {task}", value=n)
            continue
        keys.add(it.key)
        items.append(EvalItem(task, TASKS[task], it.prompt, it.gold, None, dict(it.meta)))
    return items, keys


def _task_docs(
    rng: random.Random, task: str, budget: int, forbidden: set[str], shots: list[EvalItem] | None
) -> list[str]:
    """Training/validation documents of one task until ``budget`` bytes: 1-4 items per document
    (a passage with 1-3 questions for ``passage_qa``), never an item whose key is ``forbidden``."""
    gen = GENERATORS[task]
    docs: list[str] = []
    used = 0
    while used < budget:
        if task == "passage_qa":
            doc, items = _passage_doc(rng, forbidden)
        else:
            items = []
            for _ in range(rng.randint(1, 4)):
                it = gen(rng)
                while it.key in forbidden:
                    it = gen(rng)
                items.append(it)
            doc = "\n\n".join(it.prompt + it.gold for it in items)
        if shots is not None and len(shots) < N_SHOTS:
            shots += [EvalItem(task, TASKS[task], it.prompt, it.gold, None, dict(it.meta)) for it in items]
            del shots[N_SHOTS:]
        docs.append(doc)
        used += len(doc.encode("utf-8"))
    return docs


def _knowledge_docs(rng: random.Random, entities: list[Entity], budget: int) -> tuple[list[str], list[str]]:
    """Biographies (70% of the bytes) and Q&A documents in training wordings (30%)."""
    docs, fams = [], []
    for family, share, make in (("bio", 0.7, _bio), ("bio_qa_train", 0.3, _qa_doc)):
        order = _cycle(rng, entities)
        used = 0
        while used < budget * share:
            doc = make(rng, next(order))
            docs.append(doc)
            fams.append(family)
            used += len(doc.encode("utf-8"))
    return docs, fams


def _axis_docs(
    seed: int,
    split: str,
    entities: list[Entity],
    budget: int,
    cfg: DataConfig,
    forbidden: dict[str, set[str]],
    shots: dict[str, list[EvalItem]] | None,
) -> tuple[list[str], list[str]]:
    shares = cfg.world.mix.shares()
    docs: list[str] = []
    fams: list[str] = []
    for axis in AXES:
        axis_budget = budget * shares[axis]
        if axis_budget <= 0:
            continue
        if axis == "knowledge":
            d, f = _knowledge_docs(_rng(seed, split, "knowledge"), entities, int(axis_budget))
            docs += d
            fams += f
            continue
        tasks = [t for t, a in TASKS.items() if a == axis]
        for t in tasks:
            d = _task_docs(
                _rng(seed, split, t),
                t,
                int(axis_budget / len(tasks)),
                forbidden[t],
                None if shots is None else shots.setdefault(t, []),
            )
            docs += d
            fams += [t] * len(d)
    return docs, fams


def build_world(cfg: DataConfig, *, train_bytes: int, val_bytes: int) -> World:
    """Generate the task world of ``cfg.seed``.

    ``train_bytes`` / ``val_bytes`` are the sizes of the world's training and validation text
    (``mixture.world_budget`` derives them from the real text and ``cfg.world_share``; the world knows
    nothing of the real text). Documents come grouped by family here; ``mixture`` interleaves them.
    """
    w = cfg.world
    seed = cfg.seed
    people = _population(_rng(seed, "population"), w.n_entities + w.n_unseen_entities)
    seen, unseen = people[: w.n_entities], people[w.n_entities :]

    eval_items = _knowledge_items(_rng(seed, "eval", "knowledge"), seen, unseen, w.eval_per_task)
    forbidden: dict[str, set[str]] = {}
    for task in GENERATORS:
        items, keys = _eval_items(seed, task, w.eval_per_task)
        eval_items += items
        forbidden[task] = keys
    order = list(TASKS)
    eval_items.sort(key=lambda it: order.index(it.task))  # stable: keeps generation order per task

    shots: dict[str, list[EvalItem]] = {}
    train_docs, train_family = _axis_docs(seed, "train", seen, train_bytes, cfg, forbidden, shots)
    val_docs, val_family = _axis_docs(seed, "val", seen, val_bytes, cfg, forbidden, None)
    shots["bio_qa"] = _knowledge_shots(_rng(seed, "shots", "knowledge"), seen)
    shots = {t: shots[t] for t in TASKS if t in shots}
    return World(seen, unseen, train_docs, train_family, val_docs, val_family, eval_items, shots)


def _knowledge_shots(rng: random.Random, seen: list[Entity]) -> list[EvalItem]:
    """Closed-book examples in the *training* question wordings (their facts are in training)."""
    out = []
    for i in range(N_SHOTS):
        e = rng.choice(seen)
        a = ATTRIBUTES[i % len(ATTRIBUTES)]
        q = TRAIN_QUESTIONS[a][0].format(n=e.name)
        out.append(
            EvalItem(
                "bio_qa",
                "knowledge",
                f"Question: {q}\nAnswer:",
                " " + e.value(a),
                None,
                {"entity": e.name, "attribute": a, "seen": True},
            )
        )
    return out
