"""Explained scalars beyond one logit: a small linear expression of a model's output.

    logit[" Paris"] - logit[" London"]          # a contrast, tokens given as text
    logprob[3] + logprob[5]                     # the log-probability of either of two tokens' sum
    0.5 * logit[2] - 2 * logprob["good"]
    logprob[" Paris"]@4 + logprob["."]@5        # a span: terms read at positions 4 and 5

Grammar: terms joined by ``+`` and ``-``; a term is ``[NUMBER *] KIND[TOKEN][@POSITION]`` with KIND
``logit`` or ``logprob`` and TOKEN a class / vocabulary id (an integer) or the text of one token
in quotes (``"…"`` or ``'…'``, tokenized with the model's tokenizer). At most
:data:`MAX_TERMS` terms and :data:`MAX_LENGTH` characters; nothing in it is evaluated as code.
Without ``@`` every term reads the explained position (``position=``, default the last); with it,
each term reads the ``[batch, positions, classes]`` output at its own position, every term has
one, and the expression is a *span* objective: :func:`span` builds the one of a continuation
(the sum of its tokens' log-probabilities, or logits, each read at the position that predicts it),
explained in one relevance walk (the question of LXT's users on spans, answered there by one
backward pass on the sum of the chosen logits).

A dense output (a ``[batch, channels, H, W]`` map, e.g. a segmentation's or a depth model's) has no
classes to pick: ``region[y0:y1, x0:x1]`` (``--region y0:y1,x0:x1``) explains the sum of the map over
rows y0…y1−1 and columns x0…x1−1 of every channel, per batch item, a linear function of the output
whose seed is the region's indicator (:meth:`Objective.region_seed`), so relevance conserves to it.

Every term is linear in the logits z of the explained position once the softmax p is held
constant: ``logit[t]`` is z_t and ``logprob[t]`` is z_t − Σ_j p_j z_j (its gradient, as
``score="logprob"`` in :mod:`rulegraph.passes.base`). The explained scalar is therefore
Σ_j w_j z_j with the weights w (:meth:`Objective.seed`) fixed at the forward pass, and relevance
conserves to it. :meth:`Objective.value` is the expression itself, with log p; the two differ by
the entropy terms held constant (equal when the log-probability coefficients sum to 0, as in
``logprob[a] - logprob[b]``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch

from .errors import InputError

#: the quantities a term takes of the explained position, by name
QUANTITIES = ("logit", "logprob")
MAX_TERMS = 64
MAX_LENGTH = 2000
#: the largest coefficient of a term, in magnitude
MAX_COEFFICIENT = 1e6

_TERM = re.compile(r"""\s*(?P<sign>[+-])?\s*(?:(?P<coef>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\s*\*\s*)?
                       (?P<quantity>[A-Za-z_]\w*)\s*\[\s*
                       (?:(?P<id>\d+)|"(?P<dq>(?:[^"\\]|\\.)*)"|'(?P<sq>(?:[^'\\]|\\.)*)')
                       \s*\]\s*(?:@\s*(?P<position>\d+)\s*)?""", re.VERBOSE)


_REGION = re.compile(r"\s*region\s*\[\s*(\d+)\s*:\s*(\d+)\s*,\s*(\d+)\s*:\s*(\d+)\s*\]\s*")


def region(text: str) -> str:
    """``--region y0:y1,x0:x1`` as the objective ``region[y0:y1, x0:x1]``."""
    if not re.fullmatch(r"\s*\d+\s*:\s*\d+\s*,\s*\d+\s*:\s*\d+\s*", text or ""):
        raise InputError(f"--region must look like y0:y1,x0:x1 (rows y0…y1−1, columns x0…x1−1), got {text!r}")
    rows, columns = text.split(",")
    return f"region[{rows.strip()}, {columns.strip()}]"


@dataclass(frozen=True)
class Term:
    coefficient: float
    quantity: str               # "logit" or "logprob"
    token: int | str            # a class / vocabulary id, or the text of one token (before resolve)
    position: int | None = None  # the output position the term reads (``@N``); None: the explained one


@dataclass(frozen=True)
class Objective:
    """A parsed expression (see the module docstring)."""

    text: str
    terms: tuple[Term, ...]
    region: tuple[int, int, int, int] | None = None     # (y0, y1, x0, x1) of ``region[y0:y1, x0:x1]``

    @property
    def tokens(self) -> list[int | str]:
        return [t.token for t in self.terms]

    @property
    def positions(self) -> list[int] | None:
        """The output positions the terms read (``@N``), in order; ``None`` when they read the explained one."""
        return sorted({t.position for t in self.terms}) if self.terms and self.terms[0].position is not None else None

    def resolve(self, to_id: Callable[[str], int]) -> Objective:
        """Token texts replaced by their ids (``to_id`` raises :class:`InputError` for a text
        that is not exactly one token)."""
        return replace(self, terms=tuple(replace(t, token=to_id(t.token)) if isinstance(t.token, str) else t
                                         for t in self.terms))

    def check(self, classes: int) -> None:
        """Every token is an id in ``0…classes−1``, and log-probabilities have a softmax to take."""
        texts = [t.token for t in self.terms if isinstance(t.token, str)]
        if texts:
            raise InputError(f"objective {self.text!r}: token {texts[0]!r} is text; resolve it with the model's "
                             "tokenizer (rulegraph.explain(text=…) or the command line do), or give its id")
        bad = [t.token for t in self.terms if not 0 <= t.token < classes]
        if bad:
            raise InputError(f"objective {self.text!r}: id {bad[0]} is out of range; the output has {classes} "
                             f"classes (0…{classes - 1})")
        if classes < 2 and any(t.quantity == "logprob" for t in self.terms):
            raise InputError(f"objective {self.text!r}: logprob needs an output with at least 2 classes")

    def seed(self, picked: torch.Tensor) -> torch.Tensor:
        """``[batch, classes]`` weights w of the logits: Σ c·e_t for ``logit`` terms and
        Σ c·(e_t − p) for ``logprob`` terms, p = softmax(picked) held constant. For a span
        (terms with positions), ``picked`` is the whole ``[batch, positions, classes]`` output and the
        seed has its shape: each position's rows are the weights of the terms that read it."""
        if self.positions is not None:
            self.check_positions(picked)
            seed = torch.zeros_like(picked)
            for position in self.positions:
                terms = tuple(replace(t, position=None) for t in self.terms if t.position == position)
                seed[:, position] = replace(self, terms=terms).seed(picked[:, position])
            return seed
        self.check(picked.shape[-1])
        seed = torch.zeros_like(picked)
        p = picked.detach().softmax(-1) if any(t.quantity == "logprob" for t in self.terms) else None
        for t in self.terms:
            seed[:, t.token] += t.coefficient
            if t.quantity == "logprob":
                seed -= t.coefficient * p
        return seed

    def at_rows(self, rows: Sequence[int] | None) -> Objective:
        """This objective read off an output holding only the positions ``rows`` (in order; a language model's
        head computed where explained, :mod:`rulegraph.canonize.rows`): a span's terms each at its row. Itself
        where ``rows`` is ``None`` or its terms read the explained position."""
        if rows is None or self.positions is None:
            return self
        index = {p: k for k, p in enumerate(rows)}
        return replace(self, terms=tuple(replace(t, position=index[t.position]) for t in self.terms))

    def check_positions(self, out: torch.Tensor) -> None:
        """A span reads a ``[batch, positions, classes]`` output at positions it has."""
        if out.dim() != 3:
            raise InputError(f"objective {self.text!r}: terms with @POSITION read a [batch, positions, classes] "
                             f"output; this output has shape {tuple(out.shape)}")
        bad = [p for p in self.positions if p >= out.shape[1]]
        if bad:
            raise InputError(f"objective {self.text!r}: position {bad[0]} is out of range; the output has "
                             f"{out.shape[1]} positions (0…{out.shape[1] - 1})")
        self.check(out.shape[-1])

    def region_seed(self, out: torch.Tensor) -> torch.Tensor:
        """The indicator of the region over the last two axes of ``out`` (``[batch, …, H, W]``), every channel."""
        if out.dim() < 3:
            raise InputError(f"objective {self.text!r}: a region needs a map output [batch, channels, H, W]; "
                             f"this output has shape {tuple(out.shape)}")
        y0, y1, x0, x1 = self.region
        height, width = out.shape[-2:]
        if not (y1 <= height and x1 <= width):
            raise InputError(f"objective {self.text!r}: the region is outside the map ({height}×{width}: rows "
                             f"0:{height}, columns 0:{width})")
        seed = torch.zeros_like(out)
        seed[..., y0:y1, x0:x1] = 1
        return seed

    def value(self, picked: torch.Tensor) -> list[float]:
        """The expression itself per batch item (with log p, not the linearised logits), float64; for a
        region, ``picked`` is the whole output and the value its sum over the region."""
        if self.region is not None:
            return (picked.detach().double() * self.region_seed(picked)).flatten(1).sum(1).tolist()
        z = picked.detach().double()
        logp = z.log_softmax(-1)
        total = torch.zeros(z.shape[0], dtype=torch.float64)
        for t in self.terms:
            at = (slice(None),) if t.position is None else (slice(None), t.position)
            total += t.coefficient * (z if t.quantity == "logit" else logp)[(*at, t.token)]
        return total.tolist()


def span(tokens: Sequence[int], first: int, quantity: str = "logprob") -> Objective:
    """The span objective of a continuation: Σ_i ``quantity[tokens[i]]@(first + i)``, each token read at
    the position that predicts it (``first`` predicts the first token). Built, not parsed: a span as
    long as the sequence is allowed (the output's positions bound it)."""
    if quantity not in QUANTITIES:
        raise InputError(f"a span explains one of {', '.join(QUANTITIES)}; got {quantity!r}")
    if not tokens:
        raise InputError("the span has no tokens")
    if first < 0:
        raise InputError(f"the span's first position must be ≥ 0, got {first}")
    terms = tuple(Term(1.0, quantity, int(t), first + i) for i, t in enumerate(tokens))
    return Objective(" + ".join(f"{quantity}[{t.token}]@{t.position}" for t in terms), terms)


def parse(text: str) -> Objective:
    """An :class:`Objective` from its text; an error names the column and what was expected."""
    if not isinstance(text, str):
        raise InputError(f"objective must be a str, got a {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise InputError(f"objective is {len(text)} characters; the limit is {MAX_LENGTH}")
    if not text.strip():
        raise InputError("objective is empty; give terms like logit[5] - logit[7]")
    m = _REGION.fullmatch(text)
    if m is not None:
        y0, y1, x0, x1 = (int(g) for g in m.groups())
        if not (y0 < y1 and x0 < x1):
            raise InputError(f"objective {text!r}: a region needs y0 < y1 and x0 < x1 (rows y0…y1−1, columns x0…x1−1)")
        return Objective(text, (), (y0, y1, x0, x1))
    terms, at = [], 0
    while at < len(text):
        m = _TERM.match(text, at)
        if m is None or (terms and m.group("sign") is None):
            raise InputError(f"objective {text!r}: cannot read column {at + 1} ({text[at:at + 12]!r}…); expected "
                             "terms like logit[5], 0.5 * logprob[\" Paris\"] joined by + or -")
        if m.group("quantity") not in QUANTITIES:
            raise InputError(f"objective {text!r}: unknown term {m.group('quantity')!r} at column {m.start('quantity') + 1}; "
                             f"valid: {', '.join(QUANTITIES)}")
        coefficient = float(m.group("coef") or 1.0) * (-1.0 if m.group("sign") == "-" else 1.0)
        if not abs(coefficient) <= MAX_COEFFICIENT:       # 1e999 is inf: refused here, not as a zero division later
            raise InputError(f"objective {text!r}: coefficient {m.group('coef')} at column {m.start('coef') + 1} is "
                             f"{'not a finite number' if math.isinf(coefficient) else 'too large'}; "
                             f"coefficients are at most {MAX_COEFFICIENT:g} in magnitude")
        quoted = m.group("dq") if m.group("dq") is not None else m.group("sq")
        token = int(m.group("id")) if m.group("id") is not None else re.sub(r"\\(.)", r"\1", quoted)
        position = None if m.group("position") is None else int(m.group("position"))
        if terms and (position is None) != (terms[0].position is None):
            raise InputError(f"objective {text!r}: the term at column {m.start('quantity') + 1} "
                             f"{'has no' if position is None else 'has a'} @POSITION and the first "
                             f"{'has one' if position is None else 'has none'}; give every term a position "
                             "(a span) or none (the explained position)")
        terms.append(Term(coefficient, m.group("quantity"), token, position))
        if len(terms) > MAX_TERMS:
            raise InputError(f"objective has more than {MAX_TERMS} terms")
        at = m.end()
    return Objective(text, tuple(terms))
