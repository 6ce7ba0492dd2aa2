"""``explain``: the one public entry, whatever the pass.

Load the model, read the rule set, apply its canonizers, run the shared prologue
(:func:`rulegraph.passes.forward`), then the pass the rule set names (``pass:``, default
``relevance``). Per-position scores sum the boundary relevance over the hidden dimension
(images: over the channels).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from .errors import InputError
from .explanation import Explanation
from .objective import Objective, parse as parse_objective
from .passes import forward, pass_of, prepared
from .ruleset import RuleSet
from .text import Encoded, TextEncoder

__all__ = ["Explanation", "encode", "explain", "prepared"]


def explain(model: Any, rules: RuleSet | str, inputs: dict[str, Any] | None = None,
            target: int | Sequence[int] | None = None, *, text: str | None = None, question: str | None = None,
            tokenizer: str | Path | None = None, output: str | None = None,
            position: int | Sequence[int] | None = None, device: str = "cpu",
            dtype: torch.dtype = torch.float32, audit: bool = True, contrast: int | Sequence[int] | None = None,
            score: str = "logit", objective: str | Objective | None = None, **options: Any) -> Explanation:
    """Explain ``model``'s output for ``inputs`` with a rule set.

    ``model``: a :class:`~rulegraph.Graph` or anything :func:`rulegraph.load` takes. ``rules``:
    a :class:`~rulegraph.RuleSet` or a shipped name / YAML path. ``target``: the class index
    (one for all items, or one per item); default the argmax. ``output``: which graph output
    (default the first). ``position``: for ``[batch, positions, classes]`` outputs, the
    position explained (default the last), or one per batch item (a list). ``contrast``: a class (or one per item) whose logit
    is subtracted: the explained scalar is ``z_target − z_contrast``. ``score``: ``"logit"``
    (default) or ``"logprob"``: log softmax(z)_target, explained as ``z_target − Σ_j p_j z_j``
    with p = softmax(z) held constant (relevance conserves to that; ``e.extra["logprob"]`` has
    log p_target; with a contrast, log p_A − log p_B = z_A − z_B exactly). See
    :mod:`rulegraph.passes.base`. ``options``: the pass's own arguments, e.g. for
    ``pass: decomposition`` ``groups``, ``alpha``, ``threshold``, ``variant``, ``mode``
    (:class:`rulegraph.passes.decomposition.DecompositionPass`).

    Instead of ``inputs``, ``text="…"`` tokenizes a text with ``tokenizer`` (a
    ``tokenizer.json``; default: the one beside the model file) and fills the model's inputs;
    the explanation then carries the tokens (``e.tokens``). For span QA, ``question="…"`` is
    encoded before the text (the context); explain ``output="start_logits"`` (or
    ``"end_logits"``) with ``target=`` a token position (default: the predicted one).

    ``objective``: instead of target / contrast / score, a linear expression of the explained
    position's logits and log-probabilities, e.g. ``"logprob[' Paris'] - logprob[' London']"``
    (:mod:`rulegraph.objective`: tokens as ids or quoted text, tokenized with ``tokenizer``);
    ``e.extra["objective_value"]`` is its value.
    """
    graph, ruleset = prepared(model, rules)
    chosen = pass_of(ruleset)
    options = chosen.resolve(options)
    if isinstance(objective, str):
        objective = parse_objective(objective)
    if objective is not None and any(isinstance(t, str) for t in objective.tokens):
        encoder = _encoder(model, graph, tokenizer)
        objective = objective.resolve(lambda token: encoder.token_id(token, "objective token"))
    encoded = None
    if text is not None:
        if inputs is not None:
            raise InputError("give inputs or text=…, not both")
        encoded = encode(model, text, tokenizer, question)
        inputs = encoded.inputs
        options = with_words(options, [encoded])
    elif inputs is None:
        raise InputError("give the model's inputs (a dict of input name → tensor) or text=…")
    start = forward(graph, ruleset, inputs, target, output=output, position=position, device=device, dtype=dtype,
                    unmatched=chosen.unmatched, contrast=contrast, score=score, objective=objective)
    e = chosen().run(start, audit=audit, **options)
    if encoded is not None:
        e.tokens = [encoded.tokens]
        e.extra["text"] = encoded.text
    return e


def with_words(options: dict[str, Any], encoded: Sequence[Encoded]) -> dict[str, Any]:
    """The pass's options with the texts' words filled in where the pass takes them and they were
    not given (``word_ids`` and ``tokens`` of the decomposition pass: ``groups="word"``)."""
    filled = dict(options)
    if "word_ids" in filled and filled["word_ids"] is None:
        filled["word_ids"] = [e.word_ids for e in encoded]
    if "tokens" in filled and filled["tokens"] is None:
        filled["tokens"] = [e.tokens for e in encoded]
    return filled


def encode(model: Any, text: str, tokenizer: str | Path | None = None, question: str | None = None) -> Encoded:
    """``text`` tokenized for ``model`` (with ``tokenizer``, default the ``tokenizer.json`` beside the
    model file; with a ``question`` for span QA, the pair question, text): ``.inputs`` fills the
    model's inputs, ``.tokens`` and ``.special`` describe them."""
    from .loaders import load
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got a {type(text).__name__}")
    if question is not None and not isinstance(question, str):
        raise InputError(f"question must be a str, got a {type(question).__name__}")
    graph = load(model)
    encoder = _encoder(model, graph, tokenizer)
    encoded = encoder.encode(text, question)
    encoded.inputs = encoder.fill(graph, encoded, {})
    return encoded


def _encoder(model: Any, graph: Any, tokenizer: str | Path | None) -> TextEncoder:
    """The model's text encoder: ``tokenizer``, else the ``tokenizer.json`` beside the model file."""
    path = model if isinstance(model, (str, Path)) else (graph.source.partition(":")[2] or None)
    return TextEncoder.for_model(graph, path, tokenizer)
