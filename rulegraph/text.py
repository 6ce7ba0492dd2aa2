"""Text in, model inputs out: a ``tokenizers`` tokenizer.json, with the model's length limit."""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .errors import InputError
from .ir import Graph

#: the longest text (or question) rulegraph tokenizes, in characters: --text, text=, every data file format
MAX_TEXT_CHARS = 100_000


@dataclass
class Encoded:
    """One text, tokenized: the model inputs it can fill, and what to show."""

    text: str
    tokens: list[str]            # as the tokenizer names them ("Ġcapital", "##ly")
    special: list[bool]          # True for [CLS], [SEP], padding…
    word_ids: list[int | None]   # word index per token (None for special tokens)
    inputs: dict[str, torch.Tensor]
    truncated: bool = False
    question: str | None = None  # span QA: the question encoded before the text (the context)
    texts: list[str] | None = None   # each token as a reader sees it (TextEncoder.texts)


#: how an image token is shown among a vision–language model's tokens
IMAGE_TOKEN = "<image>"


def insert_image_tokens(inputs: dict[str, torch.Tensor], token: int, count: int, at: int) -> dict[str, torch.Tensor]:
    """Token inputs ``[batch, positions]`` with one picture's ``count`` image tokens inserted before position
    ``at`` of every row: ``token`` in the ids, attended in the mask, type 0 in the token types (a vision–language
    model writes the picture's features there)."""
    fills = {"input_ids": token, "attention_mask": 1}
    out = dict(inputs)
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            block = torch.full((value.shape[0], count), fills.get(name, 0), dtype=value.dtype)
            out[name] = torch.cat([value[:, :at], block, value[:, at:]], dim=1)
    return out


def with_image(encoded: Encoded, token: int, count: int) -> Encoded:
    """``encoded`` with one picture's image tokens after its leading special tokens (``[CLS]``, ``<bos>``…), shown
    as :data:`IMAGE_TOKEN` and flagged special: what a vision–language model reads with its picture."""
    at = next((k for k, flag in enumerate(encoded.special) if not flag), len(encoded.special))
    tokens = [*encoded.tokens[:at], *[IMAGE_TOKEN] * count, *encoded.tokens[at:]]
    after = encoded.texts[at:] if encoded.texts is not None else []
    if after and not after[0].startswith(" "):          # the text now follows the picture: a space between
        after = [f" {after[0]}", *after[1:]]
    texts = None if encoded.texts is None else \
        [*encoded.texts[:at], *[f" {IMAGE_TOKEN}" if at + k else IMAGE_TOKEN for k in range(count)], *after]
    return replace(encoded, tokens=tokens, texts=texts,
                   special=[*encoded.special[:at], *[True] * count, *encoded.special[at:]],
                   word_ids=[*encoded.word_ids[:at], *[None] * count, *encoded.word_ids[at:]],
                   inputs=insert_image_tokens(encoded.inputs, token, count, at))


class TextEncoder:
    """Wraps a ``tokenizers.Tokenizer`` (a ``tokenizer.json`` file)."""

    def __init__(self, path: Any, max_length: int | None = None):
        """``path``: a ``tokenizer.json``, a ``tokenizers.Tokenizer``, or a transformers fast
        tokenizer (its ``backend_tokenizer``)."""
        from tokenizers import Tokenizer
        given = getattr(path, "backend_tokenizer", path)
        if isinstance(given, Tokenizer):
            self.tokenizer = Tokenizer.from_str(given.to_str())      # a copy: padding and truncation are set here
            self.path = None
        elif isinstance(given, (str, Path)):
            path = Path(given)
            if not path.exists():
                raise InputError(f"tokenizer file not found: {path}")
            try:
                self.tokenizer = Tokenizer.from_file(str(path))
            except Exception as exc:
                raise InputError(f"{path} is not a tokenizers tokenizer.json ({str(exc).splitlines()[0]})") from None
            self.path = path
        else:
            raise InputError(f"a tokenizer is a tokenizer.json path, a tokenizers.Tokenizer or a transformers fast "
                             f"tokenizer; got a {type(path).__name__}")
        self._truncating = threading.Lock()
        self.tokenizer.no_padding()
        truncation = self.tokenizer.truncation
        self.max_length = max_length or (truncation or {}).get("max_length")
        self.tokenizer.no_truncation()

    @classmethod
    def for_model(cls, graph: Graph, model_path: str | Path | None, tokenizer: Any) -> "TextEncoder":
        """The tokenizer given (see :meth:`__init__`), or the ``tokenizer.json`` beside the model file."""
        images = [i for i in graph.inputs if i.is_float and i.shape is not None and len(i.shape) == 4]
        if images and all(i.is_float for i in graph.inputs):
            raise InputError(f"this model takes an image (input {images[0].name!r}), not text; give image=PATH "
                             "(a path, a PIL image or an array)",
                             cli=f"this model takes an image (input {images[0].name!r}), not text; give --image PATH")
        if tokenizer is None:
            if model_path is None:
                raise InputError("text needs a tokenizer: give tokenizer=PATH (a tokenizer.json) or a tokenizer "
                                 "object", cli="--text needs --tokenizer PATH (a tokenizer.json)")
            tokenizer = cls.beside(model_path)
            if tokenizer is None:
                raise InputError(f"text needs a tokenizer: give tokenizer=PATH (a tokenizer.json); none is next to "
                                 f"{model_path}",
                                 cli=f"--text needs --tokenizer PATH; no tokenizer.json next to {model_path}")
        from .loaders.metadata import export_info
        return cls(tokenizer, export_info(graph).max_length)

    @staticmethod
    def beside(model_path: str | Path) -> Path | None:
        """The ``tokenizer.json`` beside a model file (or in a model folder), if there is one."""
        base = Path(model_path)
        candidate = (base if base.is_dir() else base.parent) / "tokenizer.json"
        return candidate if candidate.is_file() else None

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
            with self._truncating:      # the setting is the tokenizer's: one thread at a time changes it
                self.tokenizer.enable_truncation(self.max_length)
                try:
                    enc = self.tokenizer.encode(*pieces)
                finally:
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
        return Encoded(text, list(enc.tokens), special, list(enc.word_ids), inputs, truncated, question,
                       _texts_of(enc, pieces))

    def texts(self, ids) -> list[str]:
        """Token ids (without the text they came from) as a reader sees them, with the space before
        a word: the tokenizer's decoding of each token (byte-level BPE's bytes and ``Ġ``,
        SentencePiece's ``▁`` become text); a WordPiece continuation without its ``##``, other
        WordPiece or word-level tokens after a space."""
        from tokenizers import decoders
        spaced = self.tokenizer.decoder is None or isinstance(self.tokenizer.decoder, decoders.WordPiece)
        out = []
        for k, i in enumerate(int(i) for i in ids):
            raw = self.tokenizer.id_to_token(i)
            if raw is None:
                out.append(f"<{i}>")
            elif spaced:
                out.append(raw[2:] if raw.startswith("##") else raw if k == 0 else " " + raw)
            else:
                out.append(self.tokenizer.decode([i], skip_special_tokens=False) or raw)
        return out

    def name(self, i: int) -> str:
        """One token as a reader sees it, e.g. to name an explained target (``' Paris'``)."""
        return self.texts([i])[0]

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
        """The graph's inputs: the user's (``inputs=``, ``--input``), else what the text provides
        (:func:`rulegraph.facts.token_feeds`)."""
        from .facts import token_feeds
        given = encoded.inputs
        feeds = token_feeds(graph, given["input_ids"], mask=given["attention_mask"], types=given["token_type_ids"],
                            given=extra)
        for name in graph.input_names:
            if name not in feeds:
                unfilled = f"the model's input {name!r} cannot be filled from text"
                raise InputError(f"{unfilled}; give it in inputs={{{name!r}: …}}",
                                 cli=f"{unfilled}; give it with --input {name}=…")
        return feeds


def _texts_of(enc, pieces: tuple[str, ...]) -> list[str]:
    """Each token of an encoding as a reader sees it: the slice of the text it covers (so bytes and
    markers of byte-level BPE, ``▁`` and ``##`` never show), after a space where the text has one
    before it; special tokens as their names."""
    out = []
    for k, (token, (start, end), sequence, special) in enumerate(
            zip(enc.tokens, enc.offsets, enc.sequence_ids, enc.special_tokens_mask)):
        if special or sequence is None or end <= start:
            out.append(token if k == 0 else " " + token)
            continue
        source = pieces[sequence]
        after_space = start > 0 and source[start - 1].isspace()
        after_other = k > 0 and (enc.special_tokens_mask[k - 1] or enc.sequence_ids[k - 1] != sequence)
        out.append((" " if k > 0 and (after_space or after_other) else "") + source[start:end])
    return out
