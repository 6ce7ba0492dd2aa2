"""Evaluation data: a CSV file with a ``text`` column, an optional ``label`` column (class index
or class name) and, for span-QA models, an optional ``answer`` column (the answer text, found
in ``text``)."""
from __future__ import annotations

import csv
import io
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, read_text
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


def read_rows(path: Path, labels: list[str] | None = None, n: int | None = None,
              classes: int | None = None) -> list[Row]:
    """The first ``n`` rows with a non-empty text, in file order; labels are class indices in
    0…``classes``−1 or names in ``labels``. Every problem is one error naming the file and line."""
    content = read_text(Path(path), "data file", InputError, encoding="utf-8-sig", limit=None)
    if not content.strip():
        raise InputError(f"{path} is empty; the data file needs a header row with a `text` column "
                         "(and optionally `label` and `answer`)")
    reader = csv.DictReader(io.StringIO(content, newline=""))
    try:
        fields = reader.fieldnames or []
        if "text" not in fields:
            raise InputError(f"{path}: no `text` column (columns: {', '.join(fields) or 'none'}); the data file "
                             "needs `text` and optionally `label` and `answer`")
        rows = []
        for i, record in enumerate(reader):
            text = (record.get("text") or "").strip()
            if not text:
                continue
            label = _label(path, i, reader.line_num, record.get("label"), labels, classes)
            rows.append(Row(i, text, label, (record.get("answer") or None)))
            if n is not None and len(rows) >= n:
                break
    except csv.Error as exc:
        raise InputError(f"{path}:{reader.line_num}: not a valid CSV file ({exc})") from None
    if not rows:
        raise InputError(f"{path}: no rows with a text")
    return rows


def _label(path: Path, i: int, line: int, value: str | None, labels: list[str] | None,
           classes: int | None) -> int | None:
    if value is None or value.strip() == "":
        return None
    value = value.strip()
    valid = (f"0…{classes - 1}" if classes else "a class index") + \
        (f" or one of {', '.join(labels)}" if labels else "")
    where = f"{path}:{line}: row {i + 1}"
    if value.lstrip("-").isdigit():
        index = int(value)
        if index < 0 or (classes is not None and index >= classes):
            raise InputError(f"{where}: label {index} is outside the model's {classes or ''} classes; "
                             f"valid: {valid}".replace("  ", " "))
        return index
    if labels and value in labels:
        return labels.index(value)
    raise InputError(f"{where}: label {value!r} is not a class label; valid: {valid}")


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
