"""Explaining generation: every token a decoder-only language model generates, explained in turn.

:func:`generate` decodes greedily (or takes a given continuation) and explains each generated
token with a rule set or a method, giving a relevance *matrix*: rows are the tokens a step can
rely on (the prompt, then the generated prefix), columns are the generated tokens, and column
``t`` holds the relevance of each row for the logit of token ``t`` at the position predicting
it (rows after that position are not inputs of step ``t``: NaN).

One forward per step at most:

* greedy: step ``t`` runs the model once on the prompt and the ``t`` tokens generated so far;
  that forward is also the explanation's forward (its argmax at the last position is the next
  token, and it is what gets explained);
* a given continuation: the whole sequence is known, so every step is explained on the one
  sequence ``prompt + continuation[:-1]`` at its own position, ``batch`` steps per call (the
  batch holds copies of the sequence, each item with its own target and position). With a
  causal model, position ``p`` sees only rows ``0…p``, so this equals explaining the prefix
  (checked in ``tests/test_generation.py``).

The matrix is the interface the renderers read (:class:`Generation`: ``rows``, ``groups``,
``columns``, ``matrix``, ``steps``), so other models plug in by filling the same fields, e.g. an
encoder–decoder with the source tokens and the target prefix as rows (groups ``source`` /
``target``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .errors import InputError
from .explanation import Explanation
from .ruleset import RuleSet

Tensor = torch.Tensor


@dataclass
class Step:
    """One generated token and its explanation."""

    token: int                       # the generated token id (the explained target)
    text: str                        # the token as the tokenizer writes it
    position: int                    # the row whose output predicts it (the explained position)
    output_value: float              # the explained scalar (the logit, or z − Σ p·z for score="logprob")
    scores: list[float]              # relevance of rows 0…position
    residual: float | None = None    # the audit's unexplained residual of the call that explained this step
    relative_error: float | None = None
    batched: int = 1                 # steps explained in that call (the audit figures are their sum)
    logprob: float | None = None     # log p(token) (score="logprob")

    def to_dict(self) -> dict[str, Any]:
        d = {"token": self.token, "text": self.text, "position": self.position, "output_value": self.output_value,
             "scores": self.scores}
        if self.residual is not None:
            d.update(residual=self.residual, relative_error=self.relative_error, batched=self.batched)
        if self.logprob is not None:
            d["logprob"] = self.logprob
        return d


@dataclass
class Generation:
    """The explained generation: ``matrix[row, step]`` is the relevance of row token ``rows[row]``
    for generated token ``columns[step]`` (NaN where the row comes after the step's position)."""

    rows: list[str]                  # prompt tokens, then the generated prefix
    groups: list[str]                # per row: "prompt" or "generated"
    steps: list[Step]
    method: str
    mode: str                        # "greedy" or "continuation"
    prompt: str | None = None
    continuation: str | None = None  # the generated text, decoded
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        return [s.text for s in self.steps]

    @property
    def matrix(self) -> Tensor:
        m = torch.full((len(self.rows), len(self.steps)), math.nan, dtype=torch.float64)
        for t, s in enumerate(self.steps):
            m[:len(s.scores), t] = torch.tensor(s.scores, dtype=torch.float64)
        return m

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "mode": self.mode, "prompt": self.prompt, "continuation": self.continuation,
                "rows": self.rows, "groups": self.groups, "columns": self.columns,
                "matrix": [[None if math.isnan(x) else x for x in row] for row in self.matrix.tolist()],
                "steps": [s.to_dict() for s in self.steps], **self.extra}


def generate(model: Any, method: str | RuleSet, *, text: str | None = None, inputs: dict[str, Any] | None = None,
             steps: int | None = None, continuation: str | Sequence[int] | None = None,
             tokenizer: str | Path | None = None, options: dict[str, Any] | None = None, batch: int = 1,
             output: str | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32, audit: bool = True,
             score: str = "logit", progress: Callable[[int], None] | None = None) -> Generation:
    """Generate ``steps`` tokens greedily after a prompt (or take ``continuation``) and explain each.

    ``model``: a causal language model whose output (``output``, default the first) is
    ``[batch, positions, vocab]``. ``method``: a rule set (a :class:`~rulegraph.RuleSet`, a shipped
    name or a YAML path) or any method of ``rulegraph methods`` (baselines take ``options``).
    The prompt is ``text`` (tokenized with ``tokenizer``, default the ``tokenizer.json`` beside the
    model) or ``inputs`` (``{"input_ids": [1, P]}``). ``continuation``: text (tokenized without
    special tokens) or token ids to explain instead of generating. Exactly ``steps`` tokens are
    generated (an end-of-text token does not stop it). ``batch``: continuation steps explained
    per call (rule sets; each call's audit is the sum over its steps). ``progress`` is called
    with the number of steps done after each call. ``score``: as in :func:`rulegraph.explain`.
    """
    from .api import explain, prepared
    from .interpreter import prepare
    from .loaders import load
    from .methods import Method, explain_with, get
    from .passes.base import SCORES
    from .text import TextEncoder

    if (steps is None) == (continuation is None):
        raise InputError("give steps=N (greedy generation) or continuation=… (tokens to explain), not both"
                         if steps is not None else "give steps=N (greedy generation) or continuation=…")
    if steps is not None and (not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 1):
        raise InputError(f"the number of tokens to generate must be an integer ≥ 1, got {steps!r}")
    if not isinstance(batch, numbers.Integral) or isinstance(batch, bool) or batch < 1:
        raise InputError(f"batch must be an integer ≥ 1, got {batch!r}")
    if score not in SCORES:
        raise InputError(f"score must be one of {', '.join(SCORES)}; got {score!r}")
    chosen: Method | None = None if isinstance(method, RuleSet) else get(method)
    ruleset = method if chosen is None else RuleSet.load(chosen.name) if chosen.kind == "rules" else None
    if chosen is not None and chosen.kind != "rules" and score != "logit":
        raise InputError(f"score='logprob' is supported by rule sets; {chosen.name} is a baseline")
    resolved = chosen.resolve(options or {}) if chosen is not None else {}
    if chosen is None and options:
        raise InputError("options set a method's options; a rule set takes none")
    graph = prepared(model, ruleset)[0] if ruleset is not None else load(model)

    # the prompt and the continuation, as ids
    encoder = None
    if text is not None or tokenizer is not None or isinstance(continuation, str):
        path = model if isinstance(model, (str, Path)) else (graph.source.partition(":")[2] or None)
        encoder = TextEncoder.for_model(graph, path, tokenizer)
    if (text is None) == (inputs is None):
        raise InputError("give the prompt as text=… or as inputs={'input_ids': …}, not both"
                         if text is not None else "give the prompt as text=… or as inputs={'input_ids': …}")
    if text is not None:
        if not isinstance(text, str) or not text.strip():
            raise InputError("the prompt text is empty")
        prompt = list(encoder.tokenizer.encode(text).ids)
    else:
        ids = inputs.get("input_ids") if isinstance(inputs, dict) else None
        ids = torch.as_tensor(ids) if ids is not None else None
        if ids is None or ids.dim() != 2 or ids.shape[0] != 1 or ids.is_floating_point():
            raise InputError("inputs must hold 'input_ids': integer token ids of shape [1, prompt length]")
        prompt = ids[0].tolist()
    if not prompt:
        raise InputError("the prompt has no tokens")
    if isinstance(continuation, str):
        given = list(encoder.tokenizer.encode(continuation, add_special_tokens=False).ids)
    elif continuation is not None:
        given = [int(i) for i in continuation]
    else:
        given = None
    if given is not None and not given:
        raise InputError("the continuation has no tokens")
    n = steps if given is None else len(given)

    # is it a language model, and does the sequence fit? (before any real work)
    plan = prepare(graph, device, dtype)
    names = [i.name for i in graph.inputs]
    output = output or graph.outputs[0]
    if output not in graph.outputs:
        raise InputError(f"no graph output named {output!r}; outputs: {', '.join(graph.outputs)}")
    if "input_ids" not in names:
        raise InputError(f"generation needs a model with an input_ids input; its inputs: {', '.join(names)}")
    probe = plan.run(_feeds(graph, [0, 0]))[output]
    if probe.dim() != 3 or probe.shape[1] != 2:
        raise InputError(f"generation needs a language model whose output {output!r} is [batch, positions, vocab]; "
                         f"this model's is {list(probe.shape)} for 2 tokens (a classifier?)")
    rows = plan.limits.ids.get("input_ids", (probe.shape[-1], ""))[0]
    if probe.shape[-1] != rows:
        raise InputError(f"generation needs a language-model head: the output {output!r} has {probe.shape[-1]} "
                         f"scores per position but the token embedding has {rows} rows (a token classifier?)")
    changed = plan.run(_feeds(graph, [0, 1]))[output][:, 0]
    if not torch.allclose(changed, probe[:, 0], rtol=1e-5, atol=1e-6 * float(probe[:, 0].abs().max())):
        raise InputError("generation needs a causal model: its output at position 0 changed with the token at "
                         "position 1 (a bidirectional model, such as a masked LM?)")
    limit = plan.limits.positions
    if limit is not None and len(prompt) + n - 1 > limit[0]:
        raise InputError(f"the prompt has {len(prompt)} tokens and {n} generated tokens need {len(prompt) + n - 1} "
                         f"positions; the model takes at most {limit[0]} ({limit[1]})")
    vocab = probe.shape[-1]
    bad = [i for i in [*prompt, *(given or [])] if not 0 <= i < vocab]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the model's vocabulary (0…{vocab - 1})")

    def one(ids: list[int], targets: list[int] | None, positions: list[int] | None) -> Explanation:
        feeds = _feeds(graph, ids, len(positions) if positions else 1)
        kw = dict(output=output, device=device, dtype=dtype, audit=audit)
        position = positions if positions else None
        if ruleset is not None:
            return explain(graph, ruleset, feeds, targets, position=position, score=score, **kw)
        return explain_with(graph, chosen, feeds, None if targets is None else targets[0],
                            position=None if position is None else position[0], **kw, **resolved)

    found: list[Step] = []
    sequence = list(prompt)
    if given is None:                                   # greedy: the explained forward picks the token
        for _ in range(n):
            found.extend(_steps(one(sequence, None, None), [len(sequence) - 1], encoder, audit))
            sequence.append(found[-1].token)
            if progress:
                progress(1)
    else:
        sequence += given
        chunk = batch if ruleset is not None else 1
        for start in range(0, n, chunk):
            positions = [len(prompt) - 1 + t for t in range(start, min(n, start + chunk))]
            e = one(sequence[:-1], [given[p - len(prompt) + 1] for p in positions], positions)
            found.extend(_steps(e, positions, encoder, audit))
            if progress:
                progress(len(positions))
    rows = sequence[:-1]
    return Generation(
        rows=[_token(encoder, i) for i in rows], groups=["prompt"] * len(prompt) + ["generated"] * (n - 1),
        steps=found, method=ruleset.name or ruleset.source if chosen is None else chosen.name,
        mode="greedy" if given is None else "continuation", prompt=text,
        continuation=encoder.tokenizer.decode([s.token for s in found]) if encoder is not None else None)


def _feeds(graph, ids: list[int], copies: int = 1) -> dict[str, Tensor]:
    """The graph's inputs for one token sequence, ``copies`` times: ids, an all-ones attention mask,
    zero token types."""
    x = torch.tensor([ids] * copies, dtype=torch.int64)
    fill = {"input_ids": x, "attention_mask": torch.ones_like(x), "token_type_ids": torch.zeros_like(x)}
    missing = [i.name for i in graph.inputs if i.name not in fill]
    if missing:
        raise InputError(f"generation fills input_ids, attention_mask and token_type_ids; the model also takes "
                         f"{', '.join(missing)}")
    return {i.name: fill[i.name] for i in graph.inputs}


def _steps(e: Explanation, positions: list[int], encoder, audit: bool) -> list[Step]:
    """One :class:`Step` per batch item of ``e`` (item ``i`` explains ``positions[i]``)."""
    key = next(iter(e.relevance))
    c = e.audit.conservation if audit and e.audit is not None else None
    found = []
    for i, p in enumerate(positions):
        found.append(Step(
            token=e.target[i], text=_token(encoder, e.target[i]), position=p, output_value=e.output_value[i],
            scores=e.relevance[key][i, :p + 1].double().tolist(),
            residual=None if c is None else c.residual, relative_error=None if c is None else c.relative_error,
            batched=len(positions), logprob=e.extra["logprob"][i] if "logprob" in e.extra else None))
    return found


def _token(encoder, i: int) -> str:
    if encoder is None:
        return str(i)
    return encoder.tokenizer.id_to_token(i) or str(i)
