"""Evaluation data: a CSV file (or JSON lines, ``.jsonl``: one object per line) with a ``text``
field, an optional ``label`` (class index or class name) and, for span-QA models, ``question``
and ``answer`` (the answer text, found in ``text``, the context; ``context`` is read as ``text``
in a file that has no ``text``, as SQuAD-style data names it). With a question, the model reads
the pair (question, text)."""
from __future__ import annotations

import csv
import io
import json
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
    question: str | None = None


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
    records = _json_lines(path, content) if Path(path).suffix == ".jsonl" else _csv(path, content)
    rows = []
    for i, (line, record) in enumerate(records):
        if i == 0:
            fields = list(record)
            if "text" not in fields and "context" not in fields:
                raise InputError(f"{path}: no `text` column (columns: {', '.join(fields) or 'none'}); the data file "
                                 "needs `text` (or `context`) and optionally `label`, `question` and `answer`")
        text = _field(record, "text") or _field(record, "context")
        if not text:
            continue
        label = _label(path, i, line, record.get("label"), labels, classes)
        rows.append(Row(i, text, label, _field(record, "answer") or None, _field(record, "question") or None))
        if n is not None and len(rows) >= n:
            break
    if not rows:
        raise InputError(f"{path}: no rows with a text")
    return rows


def _field(record: dict, name: str) -> str:
    value = record.get(name)
    return "" if value is None else str(value).strip()


def _csv(path: Path, content: str):
    """(line, record) per CSV row; an empty file has no header."""
    reader = csv.DictReader(io.StringIO(content, newline=""))
    try:
        if not reader.fieldnames:
            return
        for record in reader:
            yield reader.line_num, record
    except csv.Error as exc:
        raise InputError(f"{path}:{reader.line_num}: not a valid CSV file ({exc})") from None


def _json_lines(path: Path, content: str):
    """(line, record) per non-empty line of a JSON-lines file, each a JSON object."""
    for line, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{line}: not a JSON object ({exc.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{line}: expected a JSON object with a `text` field, got {type(record).__name__}")
        yield line, {k: (v if v is None or isinstance(v, str) else json.dumps(v) if isinstance(v, (list, dict))
                         else str(v)) for k, v in record.items()}


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
            enc = encoder.encode(row.text, row.question)
            truncated += enc.truncated
            answer = None
            if row.answer:
                answer = _answer_positions(encoder, row, len(enc.tokens))
            examples.append(Example(row, enc, answer))
    return examples, truncated


def _answer_positions(encoder: TextEncoder, row: Row, length: int) -> list[bool] | None:
    """Which tokens overlap the answer's first occurrence in the text (the context: with a
    question, only the tokens of the pair's second sequence count)."""
    start = row.text.find(row.answer)
    if start < 0:
        return None
    end = start + len(row.answer)
    enc = encoder.tokenizer.encode(row.text) if row.question is None else encoder.tokenizer.encode(row.question, row.text)
    text_sequence = 0 if row.question is None else 1
    return [bool(sequence == text_sequence and e > start and s < end and e > s)
            for (s, e), sequence in zip(enc.offsets[:length], enc.sequence_ids[:length])]
