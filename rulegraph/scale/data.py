"""Data files: CSV (a header row), JSON lines (one object per line) or Parquet, with a ``text``
column, an optional ``label`` column (class index or class name) and, for span-QA models,
``question`` and ``answer`` (the answer text, found in ``text``, the context; ``context`` is read
as ``text`` in a file that has no ``text``, as SQuAD-style data names it). With a question, the
model reads the pair (question, text).

A problem with the file (missing, unreadable, no ``text`` column, a label the model does not
have) is one error before any work. A problem with one record (a JSON line that does not parse,
a text that is not a string) does not stop the run: the record becomes a :class:`Row` with its
``problem``, which the runs record as that example's failed row. Empty texts are not examples and
are passed over."""
from __future__ import annotations

import csv
import io
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import InputError, read_text
from ..text import MAX_TEXT_CHARS, Encoded, TextEncoder

COLUMNS = "the data file needs `text` (or `context`) and optionally `label`, `question` and `answer`"
#: the fields read as the text, in order of preference
TEXT_FIELDS = ("text", "context")
#: class indices are below this
MAX_CLASSES = 2**31


@dataclass
class Row:
    index: int                  # record number in the file (0-based, header excluded)
    text: str
    label: int | None = None
    answer: str | None = None
    question: str | None = None  # span QA: the model reads the pair (question, text)
    problem: str | None = None  # why this record cannot be an example (file:line and what is wrong)


@dataclass
class Example:
    row: Row
    encoded: Encoded
    answer: list[bool] | None = None

    @property
    def length(self) -> int:
        return len(self.encoded.tokens)


def _csv(path: Path) -> Iterator[tuple[int, dict | str]]:
    """The records of a CSV file, one per line: a quoted field that runs over a line end (an
    unterminated quote merges the records after it), a record with more or fewer fields than the
    header, a column named twice, text after a closing quote are errors naming the file and line."""
    content = read_text(path, "data file", InputError, encoding="utf-8-sig", limit=None)
    if not content.strip():
        raise InputError(f"{path} is empty; {COLUMNS}, under a header row")
    if csv.field_size_limit() < len(content):
        csv.field_size_limit(min(len(content) + 1, 2**31 - 1))   # long texts are refused per record, below
    reader = csv.reader(io.StringIO(content, newline=""), strict=True)
    end = 0
    try:
        fields = next(reader, [])
        twice = next((f for i, f in enumerate(fields) if f in fields[:i]), None)
        if twice is not None:
            raise InputError(f"{path}:1: column {twice!r} appears twice in the header; name each column once")
        if not any(f in fields for f in TEXT_FIELDS):
            raise InputError(f"{path}: no `text` column (columns: {', '.join(fields) or 'none'}); {COLUMNS}")
        end = reader.line_num
        for values in reader:
            start, end = end + 1, reader.line_num
            if not values:
                continue
            if end > start and any("\n" in v or "\r" in v for v in values):
                raise InputError(f"{path}:{start}: a quoted field runs over lines {start}…{end} (an unterminated "
                                 "quote?); a CSV data file holds one record per line (a text with line breaks: "
                                 "use JSON lines)")
            if len(values) != len(fields):
                raise InputError(f"{path}:{end}: the record has {len(values)} fields, the header {len(fields)} "
                                 f"({', '.join(fields)}); quote a text that holds a comma")
            yield end, dict(zip(fields, values))
    except csv.Error as exc:
        if "unexpected end of data" in str(exc):
            raise InputError(f"{path}:{end + 1}: a quoted field opened in the record starting on line {end + 1} is "
                             "never closed (an unterminated quote)") from None
        raise InputError(f"{path}:{reader.line_num}: not a valid CSV file ({exc})") from None


def _jsonl(path: Path) -> Iterator[tuple[int, dict | str]]:
    content = read_text(path, "data file", InputError, encoding="utf-8-sig", limit=None)
    seen_text = False
    # lines end at "\n" (JSON Lines) only: a text may hold U+0085, U+2028 or U+2029, which str.splitlines also
    # splits at
    for line_no, line in enumerate(content.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            yield line_no, f"not a JSON object ({exc.msg} at column {exc.colno})"
            continue
        if not isinstance(record, dict):
            yield line_no, f"not a JSON object (a {type(record).__name__})"
            continue
        seen_text = seen_text or any(f in record for f in TEXT_FIELDS)
        yield line_no, record
    if not seen_text:
        raise InputError(f"{path}: no record has a `text` field; {COLUMNS}")


def _parquet(path: Path) -> Iterator[tuple[int, dict | str]]:
    try:
        import pyarrow.parquet as pq
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the Parquet data file {path}: {str(exc).splitlines()[0]}") from None
    if not any(f in table.column_names for f in TEXT_FIELDS):
        raise InputError(f"{path}: no `text` column (columns: {', '.join(table.column_names) or 'none'}); {COLUMNS}")
    for i, record in enumerate(table.to_pylist()):
        yield i + 1, record


#: data readers by file suffix
READERS = {".csv": _csv, ".jsonl": _jsonl, ".parquet": _parquet}


def read_rows(path: Path, labels: list[str] | None = None, n: int | None = None,
              classes: int | None = None) -> list[Row]:
    """The first ``n`` records with a text (or a problem), in file order; labels are class indices
    in 0…``classes``−1 or names in ``labels``. A problem with the file is one error naming the
    file and line; a problem with one record is that row's ``problem``."""
    path = Path(path)
    if path.suffix.lower() not in READERS:
        raise InputError(f"{path}: unknown data file type {path.suffix or '(none)'!r}; "
                         f"valid: {', '.join(READERS)}")
    rows: list[Row] = []
    for i, (line, record) in enumerate(READERS[path.suffix.lower()](path)):
        if n is not None and len(rows) >= n:
            break
        where = f"{path}:{line}"
        if isinstance(record, str):
            rows.append(Row(i, "", problem=f"{where}: {record}"))
            continue
        field = next((f for f in TEXT_FIELDS if record.get(f) is not None), "text")
        text, question, answer = record.get(field), record.get("question"), record.get("answer")
        strings = ((field, text), ("question", question), ("answer", answer))
        bad = next(((name, v) for name, v in strings if v is not None and not isinstance(v, str)), None)
        if bad:
            rows.append(Row(i, "", problem=f"{where}: `{bad[0]}` is a {type(bad[1]).__name__}, not a string"))
            continue
        long = next(((name, v) for name, v in strings if v is not None and len(v) > MAX_TEXT_CHARS), None)
        if long:
            rows.append(Row(i, "", problem=f"{where}: `{long[0]}` has {len(long[1]):,} characters; a data file's "
                                           f"texts may have at most {MAX_TEXT_CHARS:,}"))
            continue
        text = (text or "").strip()
        if not text:
            continue
        label = _label(path, i, line, record.get("label"), labels, classes)
        rows.append(Row(i, text, label, answer or None, question.strip() or None if question else None))
    if not rows:
        raise InputError(f"{path}: no rows with a text")
    return rows


def _label(path: Path, i: int, line: int, value, labels: list[str] | None, classes: int | None) -> int | None:
    """A record's label as a class index: an integer (a JSON number without a fraction, or its
    digits in text) in 0…``classes``−1, or a name in ``labels``; a boolean or a fractional number
    is an error (never truncated to an index)."""
    where = f"{path}:{line}: row {i + 1}"
    valid = (f"0…{classes - 1}" if classes else "a class index") + \
        (f" or one of {', '.join(labels)}" if labels else "")
    if isinstance(value, bool):
        raise InputError(f"{where}: label {str(value).lower()} is a boolean, not a class; valid: {valid}")
    if isinstance(value, float):
        if not value.is_integer() or abs(value) >= MAX_CLASSES:
            raise InputError(f"{where}: label {value!r} is not a class index; valid: {valid}")
        raise InputError(f"{where}: label {value!r} is a decimal number; write the class index {int(value)} "
                         f"without a fraction (valid: {valid})")
    if value is None or str(value).strip() == "":
        return None
    value = str(value).strip()
    if value.lstrip("-").isdigit():
        index = int(value) if len(value) < 20 else 2**63
        if index < 0 or (classes is not None and index >= classes) or index >= MAX_CLASSES:
            shown = value if len(value) < 20 else value[:8] + "…"
            raise InputError(f"{where}: label {shown} is outside the model's {classes or ''} classes; "
                             f"valid: {valid}".replace("  ", " ") if classes else
                             f"{where}: label {shown} is not a class index (at most {MAX_CLASSES - 1}); valid: {valid}")
        return index
    if labels and value in labels:
        return labels.index(value)
    raise InputError(f"{where}: label {value!r} is not a class label; valid: {valid}")


def encode(rows: list[Row], encoder: TextEncoder) -> tuple[list[Example], int]:
    """Tokenize the rows without a problem (truncating to the model's limit); returns the examples
    and how many were truncated."""
    examples, truncated = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows:
            if row.problem:
                continue
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
