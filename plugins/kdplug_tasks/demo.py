"""The ``demo`` task: generated movie-review sentiment, small and hard in the ways KD is about.

``kdplug run`` without arguments fine-tunes the pretrained all-MiniLM-L6-v2 teacher on this task
and trains a BiLSTM student from scratch without and with KD, in minutes on a CPU. For that
comparison to mean something the task must reward what pretraining knows and a small student
trained on 800 labels does not:

* **Lexical knowledge.** Reviews use real sentiment words, about 120 per polarity. Each seed
  splits them into a frequent third and a rare rest; training reviews draw 90% of their words
  from the frequent third, dev reviews half from the rare rest, so many dev words occur once or
  never in training. A pretrained teacher knows "atrocious" is bad; a student from scratch
  does not.
* **Composition.** 30% of the reviews contrast two clauses, and the label comes from the clause
  the connective makes decisive: the one after "but", "however", "although ...,", the main
  clause before "even though". Clauses may be negated ("was not dull" is positive) or
  intensified; the other reviews have one clause, or two that agree.
* **Noise.** ``label_noise`` flips that fraction of the training labels (never dev labels); a
  teacher's soft labels are one way to see through it.

Everything is drawn from ``random.Random(seed)``: the same seed gives the same data set.
"""

from __future__ import annotations

import random
from typing import Any, Optional

import kdplug
from kdplug.errors import ConfigError
from kdplug.types import Example

from .base import DataTask, check_count, reject_unknown_options

LABELS = ("negative", "positive")

POSITIVE = (
    "superb",
    "excellent",
    "wonderful",
    "brilliant",
    "delightful",
    "gripping",
    "charming",
    "moving",
    "stunning",
    "masterful",
    "outstanding",
    "terrific",
    "captivating",
    "engaging",
    "hilarious",
    "heartfelt",
    "mesmerizing",
    "exquisite",
    "splendid",
    "marvelous",
    "riveting",
    "compelling",
    "inventive",
    "fresh",
    "clever",
    "witty",
    "beautiful",
    "elegant",
    "powerful",
    "poignant",
    "thrilling",
    "impressive",
    "memorable",
    "remarkable",
    "phenomenal",
    "sublime",
    "dazzling",
    "enchanting",
    "refreshing",
    "uplifting",
    "breathtaking",
    "flawless",
    "nuanced",
    "sharp",
    "vibrant",
    "polished",
    "absorbing",
    "affecting",
    "gorgeous",
    "lovely",
    "fantastic",
    "great",
    "good",
    "solid",
    "enjoyable",
    "pleasant",
    "strong",
    "smart",
    "fun",
    "entertaining",
    "touching",
    "funny",
    "lively",
    "luminous",
    "stellar",
    "first-rate",
    "top-notch",
    "spellbinding",
    "exhilarating",
    "rousing",
    "tender",
    "graceful",
    "confident",
    "assured",
    "genuine",
    "authentic",
    "inspired",
    "immersive",
    "majestic",
    "electrifying",
    "irresistible",
    "sparkling",
    "radiant",
    "ingenious",
    "deft",
    "accomplished",
    "admirable",
    "commendable",
    "satisfying",
    "rewarding",
    "wondrous",
    "glorious",
    "exceptional",
    "magnificent",
    "stirring",
    "superlative",
    "amazing",
    "awesome",
    "fabulous",
    "wholesome",
    "heartwarming",
    "joyous",
    "likable",
    "lovable",
    "masterly",
    "meticulous",
    "nimble",
    "perfect",
    "playful",
    "rich",
    "sensational",
    "sincere",
    "sophisticated",
    "soulful",
    "spirited",
    "stylish",
    "thoughtful",
    "tremendous",
    "vivid",
    "warm",
)

NEGATIVE = (
    "dull",
    "boring",
    "awful",
    "terrible",
    "dreadful",
    "tedious",
    "clumsy",
    "bland",
    "lifeless",
    "predictable",
    "painful",
    "atrocious",
    "abysmal",
    "mediocre",
    "forgettable",
    "weak",
    "poor",
    "sloppy",
    "incoherent",
    "tiresome",
    "insipid",
    "lackluster",
    "wooden",
    "stale",
    "shallow",
    "pointless",
    "messy",
    "bloated",
    "plodding",
    "sluggish",
    "uninspired",
    "derivative",
    "cheap",
    "flat",
    "hollow",
    "tepid",
    "vapid",
    "laughable",
    "cringeworthy",
    "grating",
    "annoying",
    "irritating",
    "contrived",
    "muddled",
    "confusing",
    "dismal",
    "horrendous",
    "appalling",
    "dire",
    "woeful",
    "lousy",
    "shoddy",
    "amateurish",
    "clunky",
    "stilted",
    "monotonous",
    "soulless",
    "pedestrian",
    "overlong",
    "unwatchable",
    "disappointing",
    "frustrating",
    "unbearable",
    "excruciating",
    "pretentious",
    "trite",
    "hackneyed",
    "banal",
    "drab",
    "dreary",
    "lame",
    "feeble",
    "inept",
    "leaden",
    "limp",
    "ponderous",
    "turgid",
    "unconvincing",
    "unfunny",
    "uneven",
    "forced",
    "heavy-handed",
    "overwrought",
    "underwhelming",
    "worthless",
    "wretched",
    "ghastly",
    "horrid",
    "rotten",
    "bad",
    "ugly",
    "mindless",
    "disjointed",
    "shrill",
    "numbing",
    "joyless",
    "lazy",
    "tacky",
    "abominable",
    "agonizing",
    "aimless",
    "cheesy",
    "chaotic",
    "crude",
    "deplorable",
    "dismaying",
    "dopey",
    "dumb",
    "embarrassing",
    "empty",
    "flimsy",
    "garbled",
    "grim",
    "hopeless",
    "idiotic",
    "lethargic",
    "murky",
    "mangled",
    "miserable",
    "obnoxious",
)

ASPECTS = (  # singular, to agree with VERBS
    "plot",
    "acting",
    "soundtrack",
    "dialogue",
    "pacing",
    "cinematography",
    "ending",
    "script",
    "cast",
    "direction",
    "humor",
    "storyline",
    "lead performance",
    "editing",
    "score",
    "main character",
    "set design",
    "costume design",
    "screenplay",
    "final act",
    "opening scene",
    "villain",
    "romance",
    "action",
    "camera work",
    "supporting cast",
    "premise",
    "climax",
    "writing",
    "visual style",
)

VERBS = ("was", "is", "felt", "seemed")
NEGATED_VERBS = (
    "was not",
    "is not",
    "wasn't",
    "isn't",
    "was never",
    "was hardly",
    "was far from",
    "did not feel",
    "never felt",
    "did not seem",
    "was not at all",
)
INTENSIFIERS = ("really", "truly", "utterly", "remarkably", "quite", "genuinely", "incredibly", "rather")
OPENERS = ("", "", "", "honestly, ", "to be fair, ", "i have to say ", "frankly, ", "in my opinion ")
FILLERS = (
    "we saw it on a rainy sunday.",
    "i went in with no expectations.",
    "my friends dragged me along.",
    "it runs about two hours.",
    "the theater was half empty.",
    "i watched it at home last night.",
    "it is based on a novel.",
    "my sister picked it.",
    "we had popcorn.",
    "it opened last friday.",
)

# Connective templates. The label is the polarity of the clause in {decisive}; {other} has the
# opposite polarity ("contrast") or the same ("agree").
CONTRAST = (
    "{other}, but {decisive}",
    "{other}; however, {decisive}",
    "although {other}, {decisive}",
    "while {other}, {decisive}",
    "{decisive}, even though {other}",
    "{decisive}, despite the fact that {other}",
    "{other}, yet {decisive}",
)
AGREE = ("{decisive} and {other}", "{decisive}, and {other} too", "{decisive}; also, {other}")
SINGLE = ("{decisive}",)
TEMPLATE_WEIGHTS = ((CONTRAST, 0.3), (AGREE, 0.3), (SINGLE, 0.4))

NEGATION_RATE = 0.1  # a clause says "not <opposite word>"
INTENSIFIER_RATE = 0.3
FILLER_RATE = 0.3
FREQUENT_FRACTION = 1 / 3  # of each word list, per seed
RARE_RATE = {"train": 0.1, "dev": 0.5}  # how often a sentiment word comes from the rare rest


class ReviewGenerator:
    """Draws reviews from one ``random.Random``; ``review(label, split)`` is one example's text."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = {}  # (polarity, "frequent" | "rare") -> words
        for polarity, words in ((1, POSITIVE), (0, NEGATIVE)):
            shuffled = list(words)
            self.rng.shuffle(shuffled)
            cut = round(len(shuffled) * FREQUENT_FRACTION)
            self.words[polarity, "frequent"], self.words[polarity, "rare"] = shuffled[:cut], shuffled[cut:]

    def word(self, polarity: int, split: str) -> str:
        pool = "rare" if self.rng.random() < RARE_RATE[split] else "frequent"
        return self.rng.choice(self.words[polarity, pool])

    def clause(self, subject: str, polarity: int, split: str) -> str:
        """'the acting was superb', or negating the opposite word: 'the acting was not dull'."""
        if self.rng.random() < NEGATION_RATE:
            return f"the {subject} {self.rng.choice(NEGATED_VERBS)} {self.word(1 - polarity, split)}"
        verb = self.rng.choice(VERBS)
        if self.rng.random() < INTENSIFIER_RATE:
            verb += " " + self.rng.choice(INTENSIFIERS)
        return f"the {subject} {verb} {self.word(polarity, split)}"

    def review(self, label: int, split: str) -> str:
        templates = self.rng.choices([t for t, _ in TEMPLATE_WEIGHTS], [w for _, w in TEMPLATE_WEIGHTS])[0]
        template = self.rng.choice(templates)
        other = label if templates is AGREE else 1 - label
        first, second = self.rng.sample(ASPECTS, 2)
        sentence = (
            self.rng.choice(OPENERS)
            + template.format(decisive=self.clause(first, label, split), other=self.clause(second, other, split))
            + "."
        )
        sentences = [sentence[0].upper() + sentence[1:]]
        if self.rng.random() < FILLER_RATE:
            filler = self.rng.choice(FILLERS)
            sentences.insert(self.rng.randrange(2), filler[0].upper() + filler[1:])
        return " ".join(sentences)

    def split(self, name: str, size: int, exclude: set[str]) -> list[Example]:
        """``size`` distinct reviews not in ``exclude``, half of each label, in random order."""
        labels = [index % 2 for index in range(size)]
        self.rng.shuffle(labels)
        examples = []
        for label in labels:
            text = self.review(label, name)
            while text in exclude:
                text = self.review(label, name)
            exclude.add(text)
            examples.append(Example(text_a=text, label=label))
        return examples


def generate(
    num_train: int = 800, num_dev: int = 400, seed: int = 0, label_noise: float = 0.05
) -> dict[str, list[Example]]:
    """The demo data set: ``{"train": [...], "dev": [...]}``, a function of its arguments only."""
    generator = ReviewGenerator(seed)
    seen: set[str] = set()
    train = generator.split("train", num_train, seen)
    dev = generator.split("dev", num_dev, seen)
    for index in generator.rng.sample(range(num_train), round(label_noise * num_train)):
        train[index] = Example(text_a=train[index].text_a, label=1 - train[index].label)
    return {"train": train, "dev": dev}


def demo_task(
    data_dir: Optional[str] = None,
    *,
    num_train: int = 800,
    num_dev: int = 400,
    seed: int = 0,
    label_noise: float = 0.05,
    max_train_examples: Optional[int] = None,
    max_dev_examples: Optional[int] = None,
    **unknown: Any,
) -> DataTask:
    """The generated review task (``data_dir`` is ignored: it needs no files)."""
    reject_unknown_options(
        "demo", unknown, ["num_train", "num_dev", "seed", "label_noise", "max_train_examples", "max_dev_examples"]
    )
    if isinstance(label_noise, bool) or not isinstance(label_noise, (int, float)) or not 0 <= label_noise < 0.5:
        raise ConfigError(f"option label_noise must be a fraction in [0, 0.5), got {label_noise!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"option seed must be an integer, got {seed!r}.")
    data = generate(
        check_count("num_train", num_train, allow_none=False),
        check_count("num_dev", num_dev, allow_none=False),
        seed,
        label_noise,
    )
    return DataTask(
        name="demo",
        labels=LABELS,
        is_pair=False,
        metrics=("accuracy",),
        main_metric="accuracy",
        reader=lambda split, limit: data[split][:limit],
        source=f"generated (seed={seed}, label_noise={label_noise})",
        text_columns=("text",),
        max_train_examples=check_count("max_train_examples", max_train_examples),
        max_dev_examples=check_count("max_dev_examples", max_dev_examples),
    )


@kdplug.hookimpl
def kdplug_register_tasks(register):
    register(
        "demo",
        demo_task,
        description="generated movie reviews, binary sentiment; needs no files "
        "(options: num_train, num_dev, seed, label_noise)",
    )
