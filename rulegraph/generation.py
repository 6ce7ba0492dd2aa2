"""Explaining generation: every token a language model generates, explained in turn, for
decoder-only models (GPT-2, Llama…) and encoder–decoders (BART, T5, Marian…) alike.

:func:`generate` decodes greedily (or takes a given continuation) and explains each generated
token with a rule set or any method, giving a relevance *matrix* (:class:`Generation`): rows are
the tokens a step can rely on, columns the generated tokens, and column ``t`` holds each row's
relevance for the logit of token ``t`` at the position that predicts it. The rows are

* decoder-only: the prompt, then the generated prefix (groups ``prompt`` / ``generated``, or
  ``continuation`` for given tokens); rows after a step's position are not inputs of that step (NaN);
* encoder–decoder: the source tokens, then the target prefix, which starts with the decoder's
  start token (groups ``source`` / ``target``); the prefix rows after a step's position get no
  relevance (causal decoder), the source rows always do. The source-vs-prefix share of each step
  is Yang et al. 2023, "Local interpretation of transformer based on linear decomposition", ACL,
  Sec. 4.2, Fig. 4–5 (:meth:`Generation.shares`);
* speech-to-text (Whisper): the source is a clip's log-mel features, shown as spans of time (group
  ``audio``, :func:`rulegraph.audio.spans`: each row the relevance of its frames over all mel bins), then
  the target prefix as above.

One forward per step at most:

* greedy: step ``t`` runs the model once on the prompt (or source) and the ``t`` tokens
  generated so far; that forward is also the explanation's forward (its argmax at the last
  position is the next token, and it is what gets explained);
* a given continuation: the whole sequence is known, so a rule set explains every step on the
  one sequence at its own position, from **one forward** (``batch`` steps per forward, default all,
  at most 256: :func:`rulegraph.passes.base.apply_targets` with each step's position), each step
  with its own walk on its values (:func:`rulegraph.passes.relevance.walk_many`) and its own audit.
  With a causal (decoder) model, position ``p`` sees only rows ``0…p``, so this equals explaining
  the prefix (``tests/test_generation.py``); a baseline runs once per step on that step's prefix,
  as greedy does, so that no method reads the tokens after it (random scores are seeded by the ids).

Each step is what :func:`rulegraph.explain` gives on the same tokens: the prompt given as text
hands the method its special tokens and the tokenizer's [PAD]/[UNK]/[MASK] (IG's ``pad``
baseline, leave-one-out's ``mask`` removal) as ``explain(text=…)`` does; a prompt given as ids,
none, as ``explain(inputs=…)``. The explained value is the logit (``score="logprob"``: the
log-probability) in both.

The renderers (``rulegraph.cli.matrix``: terminal, HTML, PNG) read a :class:`Generation` only.
"""
from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .errors import InputError, ModelError
from .explanation import Explanation
from .facts import probe_output, token_feeds
from .loaders.metadata import KEY, export_info
from .ruleset import RuleSet
from .text import IMAGE_TOKEN

Tensor = torch.Tensor

#: the decoder-side input of an encoder–decoder export
PREFIX = "decoder_input_ids"
#: export metadata: an encoder–decoder's decoder start token (rulegraph.exporters.hf)
DECODER_START = KEY["decoder_start_token_id"].name


@dataclass
class GeneratedToken:
    """One generated token and its explanation."""

    token: int                       # the generated token id (the explained target)
    text: str                        # the token as the tokenizer writes it
    position: int                    # the (decoder) position whose output predicts it
    output_value: float              # the explained scalar (the logit, or z − Σ p·z for score="logprob")
    probability: float               # p(token) at that position (the softmax of the output)
    scores: list[float]              # relevance of the rows the step sees (rows 0…, in row order)
    absorbed: float | None = None    # the step's audit
    breaks: float | None = None
    residual: float | None = None
    relative_error: float | None = None
    batched: int = 1                 # steps explained from the forward that explained this one
    logprob: float | None = None     # log p(token) (score="logprob")

    def to_dict(self) -> dict[str, Any]:
        d = {"token": self.token, "text": self.text, "position": self.position, "output_value": self.output_value,
             "probability": self.probability, "scores": self.scores}
        if self.residual is not None:
            d.update(absorbed=self.absorbed, breaks=self.breaks, residual=self.residual,
                     relative_error=self.relative_error, batched=self.batched)
        if self.logprob is not None:
            d["logprob"] = self.logprob
        return d


@dataclass
class Span:
    """The explained tokens taken together as one objective (:func:`rulegraph.objective.span`): the sum
    of their logits (or log-probabilities, ``score="logprob"``), each read at the position that
    predicts it, explained in one relevance walk on the whole sequence. The relevance is linear in
    the seed for the rule sets, so ``scores`` equal the sum of the steps' columns (up to rounding)."""

    objective: str                   # the expression explained (rulegraph.objective's grammar)
    output_value: float              # the explained scalar Σ w·z (log p linearised, p held constant)
    value: float                     # the expression itself (Σ log p for log-probabilities)
    scores: list[float]              # relevance of every row
    absorbed: float | None = None    # the walk's audit
    breaks: float | None = None
    residual: float | None = None
    relative_error: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("objective", "output_value", "value", "scores", "absorbed", "breaks",
                                              "residual", "relative_error")}


@dataclass
class Generation:
    """The explained generation: ``matrix[row, step]`` is the relevance of row token ``rows[row]``
    for generated token ``columns[step]`` (NaN where the step does not see the row)."""

    rows: list[str]                  # prompt (or source) tokens, then the generated (or target) prefix
    groups: list[str]                # per row: "prompt" / "generated" (or "continuation"), "source" / "target"
    steps: list[GeneratedToken]
    method: str
    mode: str                        # "greedy" or "continuation"
    prompt: str | None = None        # the prompt (or source) text, when given as text
    continuation: str | None = None  # the generated (or given) text, decoded
    span: Span | None = None         # the explained tokens as one objective (``span=True``)
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

    def drawn(self) -> tuple[list[str], Tensor]:
        """What the views draw: a header per column (the step's number and token, then ``Σ span``
        when the span was explained) and the matrix with the span's column after the steps'."""
        headers = [f"{i + 1} {c}" for i, c in enumerate(self.columns)]
        if self.span is None:
            return headers, self.matrix
        column = torch.tensor(self.span.scores, dtype=torch.float64)[:len(self.rows), None]
        return headers + ["Σ span"], torch.cat([self.matrix, column], 1)

    def totals(self) -> dict[str, Tensor]:
        """Per row group (in row order), its summed relevance for each step."""
        m = torch.nan_to_num(self.matrix)
        return {g: m[[r for r, h in enumerate(self.groups) if h == g]].sum(0) for g in dict.fromkeys(self.groups)}

    def shares(self) -> dict[str, Tensor]:
        """Per row group, its share of each step's relevance, |S_g| / Σ_h |S_h| with S_g the group's
        summed relevance (for an encoder–decoder, the source-vs-prefix share of Yang et al. 2023,
        Sec. 4.2; the paper does not say how signs enter: the magnitudes keep each share in
        [0, 1]); NaN where every total is 0."""
        totals = {g: t.abs() for g, t in self.totals().items()}
        whole = sum(totals.values())
        undefined = whole == 0
        safe = torch.where(undefined, torch.ones_like(whole), whole)
        return {g: torch.where(undefined, torch.full_like(t, math.nan), t / safe) for g, t in totals.items()}

    def __repr__(self) -> str:
        """One screen: the method, the generated tokens with their probabilities, the rows."""
        shown = ", ".join(f"{s.text!r} p={s.probability:.3g}" for s in self.steps[:8])
        more = f", … ({len(self.steps)} in all)" if len(self.steps) > 8 else ""
        return (f"Generation({self.method}, {self.mode}: {len(self.steps)} token(s), {len(self.rows)} rows "
                f"({', '.join(f'{g} {self.groups.count(g)}' for g in dict.fromkeys(self.groups))}))\n"
                f"  tokens: {shown}{more}"
                + ("" if self.span is None else f"\n  span (the tokens together): explained {self.span.output_value:.4g}"))

    def _repr_html_(self) -> str:
        from .render.page import generation_fragment
        return generation_fragment(self)

    def to_html(self, path: str | Path | None = None, *, overwrite: bool = False) -> str:
        """The matrix as a self-contained page; written to ``path`` when given (an existing file only
        with ``overwrite``)."""
        from .files import write_output
        from .render.page import generation_page
        page = generation_page(self)
        if path is not None:
            write_output(Path(path), page, overwrite, "the page")
        return page

    def plot(self, title: str = "", ax=None):
        """The matrix as a heatmap (matplotlib), into ``ax`` when given; returns the figure."""
        from .render.figure import generation_figure
        return generation_figure(self, title, ax)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "mode": self.mode, "prompt": self.prompt, "continuation": self.continuation,
                "rows": self.rows, "groups": self.groups, "columns": self.columns,
                "matrix": [[_finite(x) for x in row] for row in self.matrix.tolist()],
                "shares": {g: [_finite(x) for x in s.tolist()] for g, s in self.shares().items()},
                "steps": [s.to_dict() for s in self.steps],
                **({"span": self.span.to_dict()} if self.span is not None else {}), **self.extra}


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass(frozen=True)
class Clip:
    """A speech-to-text model's clip in a generation: its log-mel features (the input ``name``), the source of
    every step, shown as the rows ``spans`` (``(first frame, end frame, label)``, :func:`rulegraph.audio.spans`)."""

    name: str
    features: Tensor
    spans: tuple[tuple[int, int, str], ...]
    record: dict[str, Any]


@dataclass(frozen=True)
class Picture:
    """A vision–language model's picture in a generation: its preprocessed pixels (the input ``name``), given at
    every step, and its ``tokens`` image tokens at position ``at`` of the sequence, one row of the matrix."""

    name: str
    pixels: Tensor
    at: int
    tokens: int


class _Layout:
    """How a language model's token sequences become its inputs and the matrix rows.

    Decoder-only: the sequence is the prompt and what follows it; rows are the sequence.
    Encoder–decoder: the source is fixed (token ids, or a speech-to-text model's clip); the sequence is the
    target prefix (from the decoder's start token); rows are the source, then the prefix."""

    def __init__(self, graph, output: str, source: list[int] | None, special: list[bool] | None = None,
                 picture: Picture | None = None, clip: Clip | None = None):
        self.graph, self.output, self.source, self.given_special = graph, output, source, special
        self.picture, self.clip = picture, clip
        names = [i.name for i in graph.inputs]
        self.sequence_input = PREFIX if source is not None else "input_ids"
        fill = {"input_ids", "attention_mask", "token_type_ids"} | ({PREFIX} if source is not None else set()) | \
            {x.name for x in (picture, clip) if x is not None}
        missing = [n for n in names if n not in fill]
        if missing:
            raise InputError(f"generation fills {', '.join(sorted(fill))}; the model also takes {', '.join(missing)}")

    @property
    def encoder_decoder(self) -> bool:
        return self.source is not None

    def feeds(self, sequence: list[int]) -> dict[str, Tensor]:
        """The graph's inputs for ``sequence`` (all-ones masks, zero token types)."""
        seq = torch.tensor([sequence], dtype=torch.int64)
        if self.clip is not None:
            return {self.clip.name: self.clip.features, PREFIX: seq}
        ids = torch.tensor([self.source], dtype=torch.int64) if self.encoder_decoder else seq
        feeds = token_feeds(self.graph, ids, prefix=seq if self.encoder_decoder else None)
        return feeds if self.picture is None else {**feeds, self.picture.name: self.picture.pixels}

    def special(self, sequence: list[int]) -> Tensor | None:
        """``[1, tokens]`` flags of the special tokens of the token input (the prompt's as the
        tokenizer marked them, a generated token never; the source's), as :func:`rulegraph.explain`
        hands a text's to a method; ``None`` where the prompt was given as ids."""
        if self.given_special is None:
            return None
        flags = self.given_special if self.encoder_decoder else \
            self.given_special + [False] * (len(sequence) - len(self.given_special))
        return torch.tensor([flags], dtype=torch.bool)

    def rows(self, e: Explanation, position: int) -> list[float]:
        """Row scores of ``e`` (one item) explained at ``position``: the rows that step sees."""
        if self.sequence_input not in e.relevance:
            raise InputError(f"{e.method} scores only {', '.join(e.relevance)} of this model, not its "
                             f"{self.sequence_input}: a generation's rows need both (the source and the target "
                             f"prefix); use a rule set (attnlrp, gi…) or ig")
        seq = e.relevance[self.sequence_input][0, :position + 1].double().tolist()
        if self.picture is not None:        # the picture's tokens as one row: the pixels' relevance (theirs is 0)
            at, n = self.picture.at, self.picture.tokens
            seq = [*seq[:at], sum(seq[at:at + n]) + float(e.relevance[self.picture.name][0].double().sum()),
                   *seq[at + n:]]
        if not self.encoder_decoder:
            return seq
        if self.clip is not None:           # the clip's spans: each its frames' relevance over all mel bins
            frames = e.boundary.get(self.clip.name) if e.boundary else None
            if frames is None or frames.dim() != 3:
                raise InputError(f"{e.method} gives no relevance per frame of the clip's {self.clip.name}; a "
                                 "generation's rows need it: use a rule set (attnlrp, gi…) or ig")
            over_time = frames[0].double().sum(0)
            return [float(over_time[a:b].sum()) for a, b, _ in self.clip.spans] + seq
        return e.relevance["input_ids"][0].double().tolist() + seq


def generate(model: Any, method: str | RuleSet, *, text: str | None = None, inputs: dict[str, Any] | None = None,
             max_new_tokens: int | None = None, continuation: str | Sequence[int] | None = None,
             tokenizer: str | Path | None = None, batch: int | None = None,
             output: str | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32, audit: bool = True,
             score: str = "logit", ignore_eos: bool = False, progress: Callable[[int], None] | None = None,
             steps: int | None = None, options: dict[str, Any] | None = None, span: bool = False,
             image: Any = None, audio: Any = None, **method_options: Any) -> Generation:
    """Generate up to ``max_new_tokens`` tokens greedily after a prompt (or take ``continuation``)
    and explain each.

    ``model``: a causal language model whose output (``output``, default the first) is
    ``[batch, positions, vocab]``, or an encoder–decoder export (inputs ``input_ids``,
    ``attention_mask``, ``decoder_input_ids``; output ``[batch, target positions, vocab]``), whose
    prefix starts with the decoder start token the export recorded. ``method``: a rule set (a
    :class:`~rulegraph.RuleSet`, a shipped name or a YAML path) or any method of ``rulegraph
    methods``, with its options as keywords, as :func:`rulegraph.explain` takes them (a
    decomposition's ``alpha="signed"``, IG's ``steps=16``; ``options={…}`` is their former form).
    The prompt (decoder-only) or
    source (encoder–decoder) is ``text`` (tokenized with ``tokenizer``, default the
    ``tokenizer.json`` beside the model) or ``inputs`` (``{"input_ids": [1, P]}``; an
    encoder–decoder may add its ``decoder_input_ids`` ``[1, T]``, a prefix that starts with the
    start token: its tokens after the start are then the continuation). ``continuation``: text
    (tokenized without special tokens) or token ids to explain instead of generating. Generation
    stops after the end-of-sequence token (the export's ``rulegraph.eos_token_id``, else the
    tokenizer's ``</s>`` / ``<|endoftext|>``…), which is explained too, unless ``ignore_eos``.
    ``steps``: the former name of ``max_new_tokens``, for a method with no option ``steps``; for
    one with it (IG), its option, refused where it would be read as the number of tokens. ``batch``:
    a continuation's steps explained per forward by a rule set (default all, at most 256).
    ``progress`` is called with the number of steps done after each call. ``score``: as in
    :func:`rulegraph.explain`. ``span``: also explain the explained tokens together, as one
    objective (the sum of their logits, or log-probabilities with ``score="logprob"``) in one more
    forward and walk (:class:`Span`, ``Generation.span``; a rule set's, as objectives are). ``image``: a
    vision–language model's picture (as :func:`rulegraph.explain` takes it): its image tokens go after the
    prompt's leading special tokens, its pixels are given at every step, and it is one row of the matrix
    (group ``picture``), the relevance of its pixels. ``audio``: a speech-to-text model's clip (Whisper; as
    :func:`rulegraph.explain` takes it: a WAV file's path or samples at the model's rate), its source in place
    of a prompt: its log-mel features are given at every step, and its spans of time are the first rows (group
    ``audio``); the tokens are named by the ``tokenizer.json`` beside the model, where there is one.
    """
    from .interpreter import prepare
    from .loaders import load
    from .api import _encoder
    from .methods import Vocab, explain_with, get
    from .passes import prepared
    from .passes.base import MAX_TARGETS
    from .objective import QUANTITIES
    from .objective import span as span_objective
    from .text import TextEncoder

    if options is not None:
        warnings.warn("generate(options={…}) is now generate(…, KEY=VALUE), as explain takes them", stacklevel=2)
        if not isinstance(options, dict):
            raise InputError(f"options must be a dict of option name → value, got a {type(options).__name__}")
        both = sorted(set(options) & set(method_options))
        if both:
            raise InputError(f"give {', '.join(both)} once: as a keyword ({both[0]}=…), not also in options={{…}}")
        method_options = {**options, **method_options}
    chosen = get(method)
    if steps is not None and "steps" in {o.name for o in chosen.options}:
        if max_new_tokens is None and continuation is None and not _has_prefix(inputs):
            raise InputError(f"steps={steps!r} is ambiguous: {chosen.name}'s option steps, or the former name of "
                             f"max_new_tokens; give max_new_tokens=N for the tokens to generate (and steps=… beside "
                             f"it for {chosen.name}'s)")
        if "steps" in method_options:
            raise InputError("steps given twice (as steps=… and in options={…}); give it once")
        method_options, steps = {**method_options, "steps": steps}, None
    if steps is not None:
        warnings.warn("generate(steps=N) is now generate(max_new_tokens=N); steps= will be removed", stacklevel=2)
        if max_new_tokens is not None:
            raise InputError("give max_new_tokens=N (steps= is its former name), not both")
        max_new_tokens = steps
    steps = max_new_tokens
    if (steps is None) == (continuation is None) and not _has_prefix(inputs):
        raise InputError("give max_new_tokens=N (greedy generation) or continuation=… (tokens to explain), not both"
                         if steps is not None else "give max_new_tokens=N (greedy generation) or continuation=…")
    if steps is not None and (not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 1):
        raise InputError(f"the number of tokens to generate must be an integer ≥ 1, got {steps!r}")
    if batch is not None and (not isinstance(batch, numbers.Integral) or isinstance(batch, bool) or batch < 1):
        raise InputError(f"batch must be an integer ≥ 1, got {batch!r}")
    if score not in QUANTITIES:
        raise InputError(f"score must be one of {', '.join(QUANTITIES)}; got {score!r}")
    if not chosen.rule_set and score != "logit":
        raise InputError(f"score='logprob' is supported by rule sets; {chosen.name} is a baseline")
    if not isinstance(span, bool):
        raise InputError(f"span must be True or False, got {span!r}")
    if span and not chosen.rule_set:
        raise InputError(f"span=True explains the tokens as one objective, which rule sets do; {chosen.name} is a "
                         "baseline (its matrix has the steps' columns only)")
    resolved = chosen.resolve(method_options)
    if resolved.get("at") is not None:
        raise InputError("at= reads the inside of one explanation, which a generation's steps do not keep: explain "
                         "the step's prefix with explain(…, at=…) (--at without --generate); condition= applies per step")
    graph = prepared(model, method if isinstance(method, RuleSet) else chosen.name)[0] if chosen.rule_set \
        else load(model)

    # the prompt (or source), the decoder's start, the continuation, as ids
    encoder = None
    if text is not None or tokenizer is not None or isinstance(continuation, str):
        path = model if isinstance(model, (str, Path)) else graph.path
        encoder = TextEncoder.for_model(graph, path, tokenizer)
    if inputs is not None and not isinstance(inputs, dict):
        raise InputError(f"inputs must be a dict of input name → token ids, got a {type(inputs).__name__}")
    clip = _clip(graph, audio, model)
    if clip is not None:
        if text is not None or (inputs or {}).get("input_ids") is not None:
            raise InputError("a speech-to-text model's source is its clip (audio=…): give no text=… or input_ids",
                             cli="a speech-to-text model's source is its clip (--audio): give no --text or input_ids")
        encoder = encoder or _encoder(model, graph, None, required=False)      # tokens named where it can
    elif (text is None) == (inputs is None or inputs.get("input_ids") is None):
        raise InputError("give the prompt as text=… or as inputs={'input_ids': …}, not both"
                         if text is not None else "give the prompt as text=… or as inputs={'input_ids': …}")
    encoder_decoder = PREFIX in graph.input_names
    if _has_prefix(inputs) and not encoder_decoder:
        raise InputError(f"{PREFIX} is an encoder–decoder's input; this model takes {', '.join(graph.input_names)}")
    special = vocab = None        # a text's special tokens and the tokenizer's [PAD]/[UNK]/[MASK], as explain's
    if text is not None:
        if not isinstance(text, str) or not text.strip():
            raise InputError("the prompt text is empty")
        encoding = encoder.tokenizer.encode(text)
        prompt, special = list(encoding.ids), [bool(s) for s in encoding.special_tokens_mask]
        vocab = Vocab.from_tokenizer(encoder.tokenizer)
    elif clip is not None:
        prompt = []                         # the source is the clip
    else:
        prompt = _ids(inputs, "input_ids")
    if not prompt and clip is None:
        raise InputError("the prompt has no tokens")
    picture, prompt, special = _with_picture(graph, image, prompt, special)
    given = _continuation(encoder, continuation)
    start: list[int] = []
    if encoder_decoder:
        start = _start(graph)
        if _has_prefix(inputs):
            prefix = _ids(inputs, PREFIX)
            if prefix[:1] != start:
                raise InputError(f"the {PREFIX} given must start with the decoder start token {start[0]}, "
                                 f"got {prefix[:1]}")
            if given is not None or steps is not None:
                raise InputError(f"give {PREFIX} (a prefix to explain) or max_new_tokens=/continuation=, not both")
            given = prefix[1:]
            if not given:
                raise InputError(f"the {PREFIX} given holds only the start token: nothing to explain")
    n = steps if given is None else len(given)
    output = output or graph.outputs[0]
    if output not in graph.outputs:
        raise InputError(f"no graph output named {output!r}; outputs: {', '.join(graph.outputs)}")
    layout = _Layout(graph, output, prompt if encoder_decoder else None, special, picture, clip)
    context = start if encoder_decoder else prompt          # what the generated tokens follow

    # is it a language model, and does the sequence fit? (before any real work)
    plan = prepare(graph, device, dtype)
    _check_language_model(plan, layout, context, n, given, prompt)

    def one(sequence: list[int], **explained: Any) -> Explanation | list[Explanation]:
        """``sequence`` explained as ``explain`` would (``explained``: the target(s) and position(s))."""
        return explain_with(graph, chosen, layout.feeds(sequence), explained.pop("target", None), output=output,
                            device=device, dtype=dtype, special=layout.special(sequence), vocab=vocab, audit=audit,
                            target_score=score, **explained, **resolved)

    found: list[GeneratedToken] = []
    sequence = list(context)
    if given is None:                                   # greedy: the explained forward picks the token
        eos = None if ignore_eos else _eos(graph, encoder)
        for _ in range(n):
            found.append(_explained(one(sequence, position=len(sequence) - 1), layout, encoder, audit))
            sequence.append(found[-1].token)
            if progress:
                progress(1)
            if found[-1].token == eos:
                break
    elif chosen.rule_set:       # every step from one forward on the whole sequence, each its own walk and audit
        sequence += given
        first, known = len(context) - 1, sequence[:-1]
        chunk = min(batch or n, MAX_TARGETS)
        for begin in range(0, n, chunk):
            positions = [first + t for t in range(begin, min(n, begin + chunk))]
            steps = one(known, targets=[given[p - first] for p in positions], positions=positions)
            found.extend(_explained(e, layout, encoder, audit, batched=len(positions)) for e in steps)
            if progress:
                progress(len(positions))
    else:                       # a baseline: a call per step on its prefix (it never reads the tokens after it)
        sequence += given
        first = len(context) - 1
        for p in range(first, first + n):
            found.append(_explained(one(sequence[:p + 1], target=given[p - first], position=p), layout, encoder,
                                    audit))
            if progress:
                progress(1)
    shown = sequence[:-1]
    together = None
    if span and found:
        objective = span_objective([s.token for s in found], found[0].position, score)
        e = explain_with(graph, chosen, layout.feeds(shown), None, output=output, device=device, dtype=dtype,
                         audit=audit, objective=objective, **resolved)
        c = e.audit.conservation if audit and e.audit is not None else None
        together = Span(objective=objective.text, output_value=e.output_value[0],
                        value=e.extra["objective_value"][0], scores=layout.rows(e, len(shown) - 1),
                        absorbed=None if c is None else c.absorbed, breaks=None if c is None else c.breaks,
                        residual=None if c is None else c.residual,
                        relative_error=None if c is None else c.relative_error)
    if clip is not None:
        rows = [label for _, _, label in clip.spans] + _texts(encoder, shown)
        groups = ["audio"] * len(clip.spans) + ["target"] * len(shown)
    elif encoder_decoder:
        rows = _texts(encoder, prompt) + _texts(encoder, shown)
        groups = ["source"] * len(prompt) + ["target"] * len(shown)
    else:
        rows = _texts(encoder, shown)
        groups = ["prompt"] * len(prompt) + ["generated" if given is None else "continuation"] * (len(shown) - len(prompt))
        if picture is not None:             # its tokens as one row
            at, n = picture.at, picture.tokens
            rows = [*rows[:at], IMAGE_TOKEN, *rows[at + n:]]
            groups = [*groups[:at], "picture", *groups[at + n:]]
    return Generation(
        rows=rows, groups=groups, steps=found, method=chosen.name,
        mode="greedy" if given is None else "continuation", prompt=text,
        continuation=encoder.tokenizer.decode([s.token for s in found]) if encoder is not None else None,
        span=together, extra={} if clip is None else {"audio": clip.record})


def _with_picture(graph, image: Any, prompt: list[int], special: list[bool] | None
                  ) -> tuple[Picture | None, list[int], list[bool] | None]:
    """A vision–language model's picture (its pixels preprocessed as :func:`rulegraph.explain` does) and the
    prompt with its image tokens after the leading special tokens; ``None`` and the prompt as it was for a
    model without a picture. Refused: a picture for another model, none for a vision–language model, a prompt
    that holds the image token already."""
    from .image import ImageInput, image_input
    from .text import insert_image_tokens
    info = export_info(graph)
    if info.image_tokens is None:
        if image is not None:
            raise InputError(f"image= is a vision–language model's picture; this model takes "
                             f"{', '.join(graph.input_names)}", cli="--image is a vision–language model's picture "
                             "in a generation; this model takes none")
        return None, prompt, special
    if image is None:
        raise InputError("this vision–language model reads a picture with its prompt: give image=…",
                         cli="this vision–language model reads a picture with its prompt: give --image PATH")
    if info.image_token_id in prompt:
        raise InputError(f"the prompt holds the image token ({info.image_token_id}) already; give it without: the "
                         "picture's tokens go in with the picture")
    picture = image if isinstance(image, ImageInput) else image_input(graph, image)
    at = next((k for k, flag in enumerate(special) if not flag), len(special)) if special else 0
    ids = insert_image_tokens({"input_ids": torch.tensor([prompt])}, info.image_token_id, info.image_tokens, at)
    flags = None if special is None else [*special[:at], *[True] * info.image_tokens, *special[at:]]
    return Picture(picture.name, picture.tensor, at, info.image_tokens), ids["input_ids"][0].tolist(), flags


def _clip(graph, audio: Any, model: Any) -> Clip | None:
    """A speech-to-text model's clip: its log-mel features as :func:`rulegraph.explain` makes them
    (:func:`rulegraph.audio.audio_input`) and their spans of time; ``None`` for another model. Refused: a clip for
    another model, none for a speech-to-text model."""
    from .audio import AudioInput, audio_input, features_input, spans
    speech = PREFIX in graph.input_names and features_input(graph) is not None
    if not speech:
        if audio is not None:
            takes = ", ".join(graph.input_names)
            raise InputError(f"audio= is a speech-to-text model's clip; this model takes {takes}",
                             cli=f"--audio is a speech-to-text model's clip in a generation; this model takes {takes}")
        return None
    if audio is None:
        raise InputError("this speech-to-text model's source is a clip: give audio=… (a WAV file or samples)",
                         cli="this speech-to-text model's source is a clip: give --audio FILE.wav")
    sound = audio if isinstance(audio, AudioInput) else \
        audio_input(graph, audio, model if isinstance(model, (str, Path)) else graph.path)
    cut = spans(sound.tensor.shape[-1], sound.filled, sound.per_second)
    return Clip(sound.name, sound.tensor, tuple(cut), {**sound.extra, "note": sound.note,
                                                        "spans": [[a, b] for a, b, _ in cut]})


def _has_prefix(inputs: Any) -> bool:
    return isinstance(inputs, dict) and inputs.get(PREFIX) is not None


def _ids(inputs: Any, name: str) -> list[int]:
    """``inputs[name]`` as a list of token ids: one sequence, ``[1, length]`` integers."""
    ids = inputs.get(name) if isinstance(inputs, dict) else None
    try:
        ids = torch.as_tensor(ids) if ids is not None else None
    except (TypeError, ValueError, RuntimeError):
        ids = None
    if ids is None or ids.dim() != 2 or ids.shape[0] != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise InputError(f"inputs must hold {name!r}: integer token ids of shape [1, length]")
    return ids[0].tolist()


def _continuation(encoder, continuation: str | Sequence[int] | None) -> list[int] | None:
    """The continuation as ids: text tokenized without special tokens, or ids as given."""
    if continuation is None:
        return None
    if isinstance(continuation, str):
        given = list(encoder.tokenizer.encode(continuation, add_special_tokens=False).ids)
    else:
        try:
            given = torch.as_tensor(continuation).tolist()
        except (TypeError, ValueError, RuntimeError):
            given = None
        if not isinstance(given, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in given):
            raise InputError("continuation must be text or a flat list of token ids (integers)")
    if not given:
        raise InputError("the continuation has no tokens")
    return given


#: end-of-sequence tokens of common tokenizers, where the export records none
EOS_TOKENS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>", "<eos>", "<|eot_id|>")


def _eos(graph, encoder) -> int | None:
    """The end-of-sequence token: the export's ``rulegraph.eos_token_id``, else the tokenizer's."""
    recorded = export_info(graph).eos_token_id
    if recorded is not None:
        return recorded
    if encoder is None:
        return None
    return next((i for i in (encoder.tokenizer.token_to_id(t) for t in EOS_TOKENS) if i is not None), None)


def _start(graph) -> list[int]:
    """The decoder start token an encoder–decoder export recorded."""
    start = export_info(graph).decoder_start_token_id
    if start is None:
        raise ModelError(f"the export does not record its decoder start token ({DECODER_START}): export it again "
                         f"with `rulegraph export`, or give inputs={{{PREFIX!r}: [[start, …]]}}")
    return [start]


#: the most positions generated for a model whose export states no length limit (no rulegraph.max_length,
#: no position table: rotary positions)
UNSTATED_LIMIT = 8192


def _check_language_model(plan, layout: _Layout, context: list[int], n: int, given: list[int] | None,
                          prompt: list[int]) -> None:
    """Refuse, before any work, a model that is not a (causal) language model, a sequence longer than
    the model takes, or a token outside its vocabulary."""
    output = layout.output
    # a vision–language model's probes hold its picture's tokens first (it refuses ids without them)
    front = [] if layout.picture is None else context[layout.picture.at:layout.picture.at + layout.picture.tokens]
    token = context[-1] if front else context[0]
    probe = probe_output(layout.graph, layout.feeds([*front, token, token]), output, plan)
    if probe.dim() != 3 or probe.shape[1] != len(front) + 2:
        raise InputError(f"generation needs a language model whose output {output!r} is [batch, positions, vocab]; "
                         f"this model's is {list(probe.shape)} for {len(front) + 2} tokens (a classifier?)")
    probe = probe[:, len(front):]
    table = plan.limits.ids.get(layout.sequence_input, (probe.shape[-1], ""))[0]
    if probe.shape[-1] != table:
        raise InputError(f"generation needs a language-model head: the output {output!r} has {probe.shape[-1]} "
                         f"scores per position but the token embedding has {table} rows (a token classifier?)")
    image_token = export_info(layout.graph).image_token_id if layout.picture is not None else None
    other = (token + 1) % probe.shape[-1]
    if other == image_token:
        other = (other + 1) % probe.shape[-1]
    changed = plan.run(layout.feeds([*front, token, other]))[output][:, len(front)]
    if not torch.allclose(changed, probe[:, 0], rtol=1e-5, atol=1e-6 * float(probe[:, 0].abs().max())):
        raise InputError("generation needs a causal model: its output at position 0 changed with the token at "
                         "position 1 (a bidirectional model, such as a masked LM?)")
    needed = len(context) + n - 1
    limit = plan.limits.positions or (UNSTATED_LIMIT, "rulegraph's limit for a model that states none: export it "
                                                      "with `rulegraph export` to record its rulegraph.max_length")
    if needed > limit[0]:
        raise InputError(f"the prompt has {len(context)} tokens and {n} generated tokens need {needed} positions; "
                         f"the model takes at most {limit[0]} ({limit[1]})")
    vocab = probe.shape[-1]
    bad = [i for i in [*prompt, *context, *(given or [])] if not 0 <= i < vocab]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the model's vocabulary (0…{vocab - 1})")


def _explained(e: Explanation, layout: _Layout, encoder, audit: bool, batched: int = 1) -> GeneratedToken:
    """The :class:`GeneratedToken` of ``e``, one step explained at its position; ``batched``: the steps its
    forward explained."""
    c = e.audit.conservation if audit and e.audit is not None else None
    p, token = e.position, e.target[0]
    return GeneratedToken(
        token=token, text=_token(encoder, token), position=p, output_value=e.output_value[0],
        probability=float(e.output_at(p)[0].double().softmax(-1)[token]), scores=layout.rows(e, p),
        absorbed=None if c is None else c.absorbed, breaks=None if c is None else c.breaks,
        residual=None if c is None else c.residual, relative_error=None if c is None else c.relative_error,
        batched=batched, logprob=e.extra["logprob"][0] if "logprob" in e.extra else None)


def _token(encoder, i: int) -> str:
    """A generated token as a reader sees it (its id without a tokenizer)."""
    return str(i) if encoder is None else encoder.name(i)


def _texts(encoder, ids: list[int]) -> list[str]:
    """Row tokens as a reader sees them (their ids without a tokenizer)."""
    return [str(i) for i in ids] if encoder is None else encoder.texts(ids)
