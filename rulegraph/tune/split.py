"""The data split once: tune / validation / test by a seeded hash of each text, recorded.

Each distinct text gets ``SHA-256(seed, text)``; the texts in the order of their hashes are cut at
the split's fractions (at least one text in each part), so a split depends only on the seed and the
texts (not on the file's order), and a text repeated in the file stays in one part (no text is both
searched on and tested on). The search runs on ``tune``, the choice among its best trials on
``validation``, the one final report on ``test``. Each part is written as JSON lines beside the
record of which record went where (``split.csv``).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..files import write_file
from ..scale.data import READERS, TEXT_FIELDS

PARTS = ("tune", "validation", "test")
#: the default fractions of the texts in each part
FRACTIONS = (0.6, 0.2, 0.2)


@dataclass
class Split:
    """Which records (numbers in the data file, 0-based) are in each part, and the records themselves."""

    parts: dict[str, list[int]]
    records: list[dict]

    def sizes(self) -> dict[str, int]:
        return {p: len(ix) for p, ix in self.parts.items()}

    def write(self, folder: Path) -> dict[str, Path]:
        """``folder/split.csv`` (record, part) and each part's records as ``folder/data/PART.jsonl``; their paths."""
        (folder / "data").mkdir(parents=True, exist_ok=True)
        part_of = {i: p for p, ix in self.parts.items() for i in ix}
        write_file(folder / "split.csv", "record,part\n" + "".join(f"{i},{part_of[i]}\n" for i in sorted(part_of)),
                   "split.csv")
        paths = {}
        for part, ix in self.parts.items():
            paths[part] = folder / "data" / f"{part}.jsonl"
            # ASCII escapes: a text's U+0085, U+2028 … written raw would end a line for the JSON-lines reader
            write_file(paths[part], "".join(json.dumps(self.records[i], default=str) + "\n" for i in ix),
                       f"{part}.jsonl")
        return paths


def key(text: str, seed: int) -> str:
    """A text's place in the split order."""
    return hashlib.sha256(f"{seed}\0{text}".encode()).hexdigest()


def fractions(spec: str) -> tuple[float, float, float]:
    """``"60,20,20"`` (percent, or fractions) → three fractions adding to 1."""
    try:
        values = [float(v) for v in spec.split(",")]
    except ValueError:
        raise InputError(f"--split {spec!r} must be three numbers, e.g. 60,20,20 (tune, validation, test)") from None
    if len(values) != 3 or any(v <= 0 for v in values):
        raise InputError(f"--split {spec!r} must be three positive numbers, e.g. 60,20,20 (tune, validation, test)")
    total = sum(values)
    return tuple(v / total for v in values)


def split(records: list[dict], seed: int, parts: tuple[float, float, float] = FRACTIONS) -> Split:
    """The split of ``records`` (dicts with a text) by the seeded hash of each distinct text."""
    texts = [str(next(r[f] for f in TEXT_FIELDS if r.get(f) is not None)) for r in records]
    distinct = sorted(set(texts), key=lambda t: key(t, seed))
    n = len(distinct)
    if n < 3:
        raise InputError(f"the data hold {n} distinct text{'s' * (n != 1)}; a split into tune, validation and test "
                         "needs at least 3")
    tune = min(max(1, round(parts[0] * n)), n - 2)
    validation = min(max(1, round(parts[1] * n)), n - tune - 1)
    part_of_text = {t: PARTS[0] if k < tune else PARTS[1] if k < tune + validation else PARTS[2]
                    for k, t in enumerate(distinct)}
    out = {p: [i for i, t in enumerate(texts) if part_of_text[t] == p] for p in PARTS}
    return Split(out, records)


def read_records(path: Path) -> list[dict]:
    """The records of a data file (CSV, JSON lines, Parquet) that have a text, in file order."""
    path = Path(path)
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise InputError(f"{path}: unknown data file type {path.suffix or '(none)'!r}; valid: {', '.join(READERS)}")
    out = []
    for line, record in reader(path):
        if isinstance(record, str):
            raise InputError(f"{path}:{line}: {record}")
        text = next((record[f] for f in TEXT_FIELDS if record.get(f) is not None), None)
        if isinstance(text, str) and text.strip():
            out.append(record)
    if not out:
        raise InputError(f"{path}: no records with a text")
    return out
