"""What ``rulegraph check`` runs: everything ``explain`` does, on made-up inputs, with every gap named.

Reading op names and rule files alone misses what only running shows: a Reshape whose target was
traced at one length, an op mode with no implementation, a rule that fails on the values it meets.
:func:`dry_run` first asks :func:`rulegraph.passes.admit` — the function ``explain`` asks — whether
the output can be explained (its refusal, if any, is ``explain``'s, word for word: ops without an
implementation, then the boundary, then the output, then the rules), binds the rule set to the graph
as explained (rules that cannot apply, nodes without a rule), runs the forward on small inputs of the
model's declared shapes at two lengths (:func:`made_up_inputs`: ids within every embedding table,
images of a size the graph's strides divide) and, where all that is clean, the whole explanation at
the first length, and returns every gap at once. A gap names the node where the message does and the
reason; an error that is not a :class:`~rulegraph.errors.RulegraphError` is reported as a gap too, never raised.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import RulegraphError
from .ir import Graph
from .facts import is_mask, item_shape
from .loaders.metadata import export_info
from .ops import unsupported
from .text import insert_image_tokens

#: the lengths of the made-up token inputs (two, so an export fixed to its traced length shows)
LENGTHS = (6, 11)
_NODE = re.compile(r"node '([^']+)'")
_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")


@dataclass(frozen=True)
class Gap:
    """One reason ``explain`` would fail: ``kind`` (``op``, ``rule``, ``unmatched``, ``boundary``,
    ``output``, ``run``, ``explain``), the node (where known) and the reason, one line."""

    kind: str
    node: str | None
    reason: str

    def __str__(self) -> str:
        return self.reason


@dataclass
class DryRun:
    """The binding (``None`` when the rule set cannot bind to the graph) and every gap found."""

    graph: Graph
    binding: Any
    gaps: list[Gap] = field(default_factory=list)
    lengths: tuple[int, ...] = ()
    #: what explain returned at each length it ran at (the inputs are :func:`made_up_inputs`)
    explanations: dict[int, Any] = field(default_factory=dict)
    #: why explain refuses this output before any input (rulegraph.passes.admit's one line), if it does
    refusal: str | None = None
    #: the made-up inputs' shapes, one line per length (``input_ids 1×6``, ``pixel_values 1×3×32×32``)
    shapes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.gaps and self.refusal is None


def dry_run(model: Any, rules: Any, *, lengths: tuple[int, ...] = LENGTHS, tokenizer: str | Path | None = None,
            dtype: torch.dtype = torch.float32, output: str | None = None, score: str = "logit") -> DryRun:
    """Bind ``rules`` to ``model`` and run the explanation of ``output`` (default the first; ``score`` as
    ``explain`` takes it) in ``dtype`` on made-up inputs at ``lengths`` (see the module docstring).
    Loading the model and reading the rule file raise as ``explain`` does."""
    from .interpreter import prepare
    from .passes import admit, forward, pass_of, prepared
    graph, ruleset = prepared(model, rules)
    refusal, explained = None, graph
    try:
        explained = admit(graph, ruleset, output, score).graph
    except RulegraphError as exc:
        refusal = _gap("output", exc)
    try:
        binding = ruleset.bind(explained)
    except RulegraphError as exc:      # no boundary, a lookup indexed from two inputs…
        return DryRun(graph, None, [_gap("boundary", exc)], refusal=refusal and refusal.reason)
    run = DryRun(graph, binding, refusal=refusal and refusal.reason)
    missing = unsupported(graph.nodes)
    for (domain, op), names in missing.items():
        where = f", domain {domain}" if domain not in ("", "ai.onnx") else ""
        more = f" and {len(names) - 1} more node(s)" if len(names) > 1 else ""
        run.gaps.append(Gap("op", names[0], f"node {names[0]!r}{more}: op {op}{where} has no implementation in rulegraph"))
    run.gaps.extend(_gap("rule", p) for p in binding.problems if p.__class__.__name__ != "UnsupportedOpError")
    if binding.unmatched and ruleset.on_unmatched == "error":
        run.gaps.extend(Gap("unmatched", n.name, f"{ruleset.source}: no rule matches node {n.name!r} (op {n.op})")
                        for n in binding.unmatched)
    if refusal is not None and not run.gaps:
        run.gaps.append(refusal)        # the output (a rule's or an op's refusal is listed above)
    if missing or refusal is not None:
        return run                      # the forward cannot run, or explain refuses before it
    sizes = _lengths(graph, lengths)
    run.lengths = sizes
    feeds = {n: made_up_inputs(graph, n, tokenizer=tokenizer, model_path=graph.path) for n in sizes}
    run.shapes = [_describe(inputs) for inputs in feeds.values()]
    plan = prepare(explained)
    failed = False
    for n, inputs in feeds.items():
        try:
            with torch.no_grad():
                plan.run(inputs, keep=frozenset())
        except Exception as exc:        # noqa: BLE001 — reported as a gap, whatever it is
            failed = True
            _add(run, _gap("run", exc, f"the forward fails on a made-up input of {_describe(inputs)}: "))
    if failed or run.gaps:
        return run
    chosen = pass_of(ruleset)
    for n, inputs in list(feeds.items())[:1]:       # the pass at one length: the forward ran at every length
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                start = forward(graph, ruleset, inputs, None, output=output, position=None, device="cpu",
                                dtype=dtype, score=score, chosen=chosen)
                run.explanations[n] = chosen().run(start, audit=True, **chosen.resolve({}))
        except Exception as exc:        # noqa: BLE001
            _add(run, _gap("explain", exc, f"explain fails on a made-up input of {_describe(inputs)}: "))
    return run


def _add(run: DryRun, gap: Gap) -> None:
    """Add ``gap`` unless the same reason was found at the other length."""
    tail = gap.reason.split(": ", 1)[-1]
    if not any(g.reason.split(": ", 1)[-1] == tail for g in run.gaps):
        run.gaps.append(gap)


def _gap(kind: str, exc: BaseException, prefix: str = "") -> Gap:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if not isinstance(exc, RulegraphError):
        text = f"{type(exc).__name__}: {text}"
    m = _NODE.search(text)
    return Gap(kind, m.group(1) if m else None, prefix + text)


def _describe(inputs: dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{k} {'×'.join(map(str, v.shape))}" for k, v in inputs.items())


def _lengths(graph: Graph, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """``lengths`` within the model's limit (``rulegraph.max_length``, else its position table); one
    length when no input has a free sequence axis (an image model)."""
    free = any(i.shape is not None and len(i.shape) > 1 and not isinstance(i.shape[1], int) for i in graph.inputs)
    if not free:
        return lengths[:1]
    from .interpreter import prepare
    bound = prepare(graph).limits.positions          # rulegraph.max_length, else a position table's rows
    if bound is not None:
        lengths = tuple(min(n, bound[0]) for n in lengths)
    return tuple(dict.fromkeys(lengths))


def made_up_inputs(graph: Graph, length: int, *, tokenizer: str | Path | None = None,
                   model_path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """One item of inputs of the graph's declared shapes: free dims 1 (the first) or ``length``; an image's
    (a float input of rank 4) free height and width the side :func:`_spatial` gives, a waveform's (a float
    input of rank 2) free length the samples :func:`_samples` gives.
    Token inputs come from a made-up text of plain vocabulary words when a tokenizer is given or lies
    beside the model (so special tokens are where the model expects them: an eos at the end for an
    encoder–decoder classifier), else ids 5, 6, … below the embedding table's rows (0, 1, … for a table of 5 rows or fewer; each row ending in
    the ``rulegraph.eos_token_id`` an encoder–decoder classifier's export records); masks are ones,
    token types zeros, float inputs seeded normal values. A vision–language model's ids start with one picture's
    image tokens (``rulegraph.image_tokens`` of them)."""
    text = _text_inputs(graph, length, tokenizer, model_path)
    g = torch.Generator().manual_seed(length)
    feeds = {}
    side = _spatial(graph, length)
    for info in graph.inputs:
        rank = len(info.shape) if info.is_float and info.shape is not None else 0
        dims = item_shape(info, side if rank == 4 else _samples(graph, length) if rank == 2 else length)
        if info.is_float:
            feeds[info.name] = torch.randn(dims, generator=g)
        elif text is not None and info.name in text and (len(dims) < 2 or isinstance(info.shape[1], str)
                                                          or info.shape[1] is None):
            feeds[info.name] = text[info.name].to(info.dtype)
        elif is_mask(info):
            feeds[info.name] = torch.ones(dims, dtype=info.dtype)
        elif "type" in info.name or info.dtype == torch.bool:
            feeds[info.name] = torch.zeros(dims, dtype=info.dtype)
        else:
            rows = _rows(graph, info.name)
            low = 5 if rows > 5 else 0          # past the usual special ids, where the table has rows past them
            feeds[info.name] = (low + torch.arange(int(torch.tensor(dims).prod())) % (rows - low)).reshape(
                dims).to(info.dtype)
    if text is not None and "decoder_input_ids" in feeds and "decoder_input_ids" not in text and "input_ids" in text:
        # the made-up text as the target too (a speech-to-text model's decoder reads it with no source text)
        feeds["decoder_input_ids"] = feeds.get("input_ids", text["input_ids"]).to(feeds["decoder_input_ids"].dtype)
    info = export_info(graph)
    if info.image_tokens is not None and "input_ids" in feeds:      # a vision–language model: its picture's tokens
        ids = feeds["input_ids"]
        feeds["input_ids"] = ids.masked_fill(ids == info.image_token_id, 5 if info.image_token_id != 5 else 6)
        feeds.update(insert_image_tokens({k: v for k, v in feeds.items() if not v.is_floating_point()},
                                         info.image_token_id, info.image_tokens, at=0))
    eos, classifier = info.eos_token_id, info.task == "sequence-classification"
    if text is None and classifier and eos is not None and "input_ids" in feeds:   # an encoder–decoder classifier's rows end in eos
        ids = feeds["input_ids"]
        ids = ids.masked_fill(ids == eos, 5 if eos != 5 else 6)
        ids[..., -1] = eos
        feeds["input_ids"] = ids
    return feeds


def _spatial(graph: Graph, length: int) -> int:
    """The side of a made-up image's free height and width: the export's ``rulegraph.image_size``
    where it states one, else the smallest multiple of the graph's total stride (the product of its
    convolutions' and poolings' strides, at most 256) that is at least ``length``, so that a
    detector joining maps of strides 16 and 32 gets sizes that line up."""
    stated = re.findall(r"\d+", graph.metadata.get("rulegraph.image_size", ""))
    if len(stated) == 3:
        return int(stated[1])
    stride = _stride(graph)
    return -(-length // stride) * stride


def _stride(graph: Graph) -> int:
    """The product of the graph's convolutions' and poolings' strides, at most 256."""
    stride = 1
    for node in graph.nodes:
        if node.op in ("Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool"):
            stride = min(stride * max(node.attrs.get("strides") or [1]), 256)
    return stride


def _samples(graph: Graph, length: int) -> int:
    """The length of a made-up waveform: :func:`rulegraph.audio.made_up_samples` at the export's
    ``rulegraph.sampling_rate`` where it states one, else ``length`` times the graph's total stride
    (:func:`_spatial`'s), so that an audio encoder's convolutional front end has frames to make."""
    from .audio import made_up_samples
    rate = export_info(graph).sampling_rate
    return made_up_samples(rate) if rate else length * _stride(graph)


def _rows(graph: Graph, name: str) -> int:
    from .interpreter import prepare
    bound = prepare(graph).limits.ids.get(name)
    return min(bound[0], 100) if bound is not None else 100


def _text_inputs(graph: Graph, length: int, tokenizer, model_path) -> dict[str, torch.Tensor] | None:
    """Token inputs of about ``length`` tokens from a made-up text, or ``None`` without a tokenizer."""
    from .text import TextEncoder
    path = Path(tokenizer) if tokenizer is not None else (
        Path(model_path).parent / "tokenizer.json" if model_path else None)
    if path is None or not path.is_file():
        return None
    try:
        encoder = TextEncoder.for_model(graph, model_path, path)
    except RulegraphError:
        return None
    vocab = encoder.tokenizer.get_vocab()
    words = [w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if _WORD.match(w)][:50]
    if not words:
        return None
    special = len(encoder.tokenizer.encode("x").ids) - len(encoder.tokenizer.encode("x", add_special_tokens=False).ids)
    count = max(length - special, 1)
    try:
        encoded = encoder.encode(" ".join(words[i % len(words)] for i in range(count)))
    except RulegraphError:
        return None
    return encoded.inputs
