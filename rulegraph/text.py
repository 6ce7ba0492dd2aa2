"""Text in, model inputs out: a ``tokenizers`` tokenizer.json, with the model's length limit."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import InputError
from .ir import Graph

#: the longest text (or question) rulegraph tokenizes, in characters: --text, text=, every data file format
MAX_TEXT_CHARS = 100_000


@dataclass
class Encoded:
    """One text, tokenized: the model inputs it can fill, and what to show."""

    text: str
    tokens: list[str]
    special: list[bool]          # True for [CLS], [SEP], padding…
    word_ids: list[int | None]   # word index per token (None for special tokens)
    inputs: dict[str, torch.Tensor]
    truncated: bool = False
    question: str | None = None  # span QA: the question encoded before the text (the context)


class TextEncoder:
    """Wraps a ``tokenizers.Tokenizer`` (a ``tokenizer.json`` file)."""

    def __init__(self, path: str | Path, max_length: int | None = None):
        from tokenizers import Tokenizer
        path = Path(path)
        if not path.exists():
            raise InputError(f"tokenizer file not found: {path}")
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise InputError(f"{path} is not a tokenizers tokenizer.json ({str(exc).splitlines()[0]})") from None
        self.tokenizer.no_padding()
        truncation = self.tokenizer.truncation
        self.max_length = max_length or (truncation or {}).get("max_length")
        self.tokenizer.no_truncation()
        self.path = path

    @classmethod
    def for_model(cls, graph: Graph, model_path: str | Path | None, tokenizer: str | Path | None) -> "TextEncoder":
        """The tokenizer given, or the ``tokenizer.json`` beside the model file."""
        if tokenizer is None:
            if model_path is None:
                raise InputError("--text needs --tokenizer PATH (a tokenizer.json)")
            candidate = Path(model_path).parent / "tokenizer.json"
            if not candidate.exists():
                raise InputError(f"--text needs --tokenizer PATH; no tokenizer.json next to {model_path}")
            tokenizer = candidate
        limit = graph.metadata.get("rulegraph.max_length")
        return cls(tokenizer, int(limit) if limit and limit.isdigit() else None)

    def encode(self, text: str, question: str | None = None) -> Encoded:
        """``text`` tokenized; for span QA with a ``question``, the pair (question, text) as the
        tokenizer's pair template puts it (``[CLS] question [SEP] text [SEP]``, token types 0 then 1)."""
        if not text.strip():
            raise InputError("the text is empty")
        if question is not None and not question.strip():
            raise InputError("the question is empty")
        for what, value in (("text", text), ("question", question or "")):
            if len(value) > MAX_TEXT_CHARS:
                raise InputError(f"the {what} has {len(value):,} characters; rulegraph reads at most "
                                 f"{MAX_TEXT_CHARS:,}")
        pieces = (text,) if question is None else (question, text)
        enc = self.tokenizer.encode(*pieces)
        truncated = False
        if self.max_length and len(enc.ids) > self.max_length:
            n = len(enc.ids)
            self.tokenizer.enable_truncation(self.max_length)
            enc = self.tokenizer.encode(*pieces)
            self.tokenizer.no_truncation()
            truncated = True
            warnings.warn(f"the text has {n} tokens; truncated to the model's limit of {self.max_length}",
                          stacklevel=2)
        ids = torch.tensor([enc.ids], dtype=torch.int64)
        inputs = {
            "input_ids": ids,
            "attention_mask": torch.tensor([enc.attention_mask], dtype=torch.int64),
            "token_type_ids": torch.tensor([enc.type_ids], dtype=torch.int64),
        }
        special = [bool(s) for s in enc.special_tokens_mask]
        return Encoded(text, list(enc.tokens), special, list(enc.word_ids), inputs, truncated, question)

    def token_id(self, text: str, what: str = "token") -> int:
        """The id of the one token ``text`` tokenizes to (no special tokens added); more or fewer
        pieces, or the unknown token, is an error naming them (``what`` says which argument)."""
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        if len(enc.ids) != 1:
            pieces = ", ".join(repr(p) for p in enc.tokens) or "none"
            raise InputError(f"{what} {text!r} is {len(enc.ids)} tokens ({pieces}), not one; give the text of "
                             "exactly one token, or its id")
        unknown = getattr(self.tokenizer.model, "unk_token", None)
        if unknown is not None and enc.tokens[0] == unknown and text.strip() != unknown:
            raise InputError(f"{what} {text!r} is not in the tokenizer's vocabulary (it tokenizes to {unknown!r})")
        return enc.ids[0]

    def fill(self, graph: Graph, encoded: Encoded, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The graph's inputs: the user's ``--input`` values, else what the text provides."""
        feeds = {}
        for info in graph.inputs:
            if info.name in extra:
                feeds[info.name] = extra[info.name]
            elif info.name in encoded.inputs:
                feeds[info.name] = encoded.inputs[info.name]
            else:
                raise InputError(f"the model's input {info.name!r} cannot be filled from text; "
                                 f"give it with --input {info.name}=…")
        return feeds
