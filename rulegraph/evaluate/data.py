"""Evaluation data: a CSV file with a ``text`` column, an optional ``label`` column (class index
or class name) and, for span-QA models, an optional ``answer`` column (the answer text, found
in ``text``)."""
from __future__ import annotations

import csv
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..text import Encoded, TextEncoder


@dataclass
class Row:
    index: int                  # row number in the file (0-based, header excluded)
    text: str
    label: int | None = None
    answer: str | None = None


@dataclass
class Example:
    row: Row
    encoded: Encoded
    answer: list[bool] | None = None

    @property
    def length(self) -> int:
        return len(self.encoded.tokens)


def read_rows(path: Path, labels: list[str] | None = None, n: int | None = None) -> list[Row]:
    """The first ``n`` rows with a non-empty text, in file order."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"data file not found: {path}")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        if "text" not in fields:
            raise InputError(f"{path}: no `text` column (columns: {', '.join(fields) or 'none'}); the data file needs "
                             "`text` and optionally `label` and `answer`")
        rows = []
        for i, record in enumerate(reader):
            text = (record.get("text") or "").strip()
            if not text:
                continue
            rows.append(Row(i, text, _label(path, i, record.get("label"), labels), (record.get("answer") or None)))
            if n is not None and len(rows) >= n:
                break
    if not rows:
        raise InputError(f"{path}: no rows with a text")
    return rows


def _label(path: Path, i: int, value: str | None, labels: list[str] | None) -> int | None:
    if value is None or value.strip() == "":
        return None
    value = value.strip()
    if value.lstrip("-").isdigit():
        return int(value)
    if labels and value in labels:
        return labels.index(value)
    raise InputError(f"{path}: row {i + 1}: label {value!r} is neither a class index nor one of "
                     f"{', '.join(labels or []) or 'the model labels (it has none)'}")


def encode(rows: list[Row], encoder: TextEncoder) -> tuple[list[Example], int]:
    """Tokenize (truncating to the model's limit); returns the examples and how many were truncated."""
    examples, truncated = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows:
            enc = encoder.encode(row.text)
            truncated += enc.truncated
            answer = None
            if row.answer:
                answer = _answer_positions(encoder, row.text, row.answer, len(enc.tokens))
            examples.append(Example(row, enc, answer))
    return examples, truncated


def _answer_positions(encoder: TextEncoder, text: str, answer: str, length: int) -> list[bool] | None:
    start = text.find(answer)
    if start < 0:
        return None
    end = start + len(answer)
    offsets = encoder.tokenizer.encode(text).offsets[:length]
    return [bool(e > start and s < end and e > s) for s, e in offsets]
