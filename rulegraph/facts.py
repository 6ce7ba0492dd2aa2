"""What rulegraph learns about a model once, and every door reads: the roles of its inputs (the token
ids, the attention mask, the token types, an encoder–decoder's decoder prefix, the token table the ids
index), the kind of each output (one probe forward, or what the export states), and the one way token
ids become the model's inputs (:func:`token_feeds`). Each is computed once per graph and kept in its
:class:`~rulegraph.ir.GraphCache` (``roles``, ``outputs``); the export's own ``rulegraph.*`` keys are
:func:`rulegraph.loaders.metadata.export_info`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from .boundary import Lookup, constant_value, lookups
from .errors import InputError, RulegraphError
from .ir import Graph, ValueInfo

Tensor = torch.Tensor

#: the names of the inputs token ids fill besides the ids themselves, as Hugging Face exports name them
MASK, TYPES, PREFIX = "attention_mask", "token_type_ids", "decoder_input_ids"


@dataclass(frozen=True)
class Roles:
    """The graph's inputs by role (``None``: the graph has none).

    Attributes:
        ids: the integer input holding the token ids (the encoder's, of an encoder–decoder): the one
            the token table (:attr:`table`) reads, else ``input_ids``, else the first integer input.
        mask: the attention mask (ones where a token is, zeros at padding).
        types: the token type (segment) ids.
        prefix: an encoder–decoder's decoder prefix (the target's tokens so far).
        table: the token-embedding lookup: of :func:`rulegraph.boundary.lookups` (which finds a
            dequantized table too), the one with the largest table (the first of equals).
    """

    ids: str | None
    mask: str | None
    types: str | None
    prefix: str | None
    table: Lookup | None


def roles(graph: Graph) -> Roles:
    """The roles of ``graph``'s inputs (see :class:`Roles`), found once (``graph.cache.roles``)."""
    if graph.cache.roles is None:
        names = graph.input_names
        table, best = None, None
        for lk in lookups(graph):
            if lk.source == PREFIX:          # the decoder's lookup of an encoder–decoder: its ids are the prefix
                continue
            # the largest table; of equal ones (GPT-2 reads its token types from the word table too) the input
            # the graph lists first, whatever order an optimizer left the lookups in
            key = (constant_value(graph, lk.table).shape[0], -names.index(lk.source) if lk.source in names else -len(names))
            if best is None or key > best:
                table, best = lk, key
        ints = [i.name for i in graph.inputs if not i.is_float]
        ids = table.source if table is not None else ("input_ids" if "input_ids" in ints else (ints or [None])[0])
        graph.cache.roles = Roles(ids, *(n if n in names else None for n in (MASK, TYPES, PREFIX)), table)
    return graph.cache.roles


def token_input(graph: Graph) -> str:
    """The integer input holding the token ids (:attr:`Roles.ids`)."""
    found = roles(graph).ids
    if found is None:
        raise InputError("the model has no integer (token id) input")
    return found


def token_feeds(graph: Graph, ids: Tensor, *, mask: Tensor | None = None, types: Tensor | None = None,
                prefix: Tensor | None = None, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The graph's inputs made from token ids ``[batch, tokens]``, in the graph's input order: the ids
    input gets ``ids``; the attention mask ``mask`` (default ones: every token real); the token types
    ``types`` (default zeros); the decoder prefix ``prefix`` (where given). ``given`` values come first.
    An input none of these fills is left out (the caller names it)."""
    given = given or {}
    found = roles(graph)
    made = {found.ids: ids, found.prefix: prefix}
    if found.mask is not None:
        made[found.mask] = torch.ones_like(ids) if mask is None else mask
    if found.types is not None:
        made[found.types] = torch.zeros_like(ids) if types is None else types
    feeds = {}
    for name in graph.input_names:
        if name in given:
            feeds[name] = given[name]
        elif made.get(name) is not None:
            feeds[name] = made[name]
    return feeds


def item_shape(info: ValueInfo, length: int) -> list[int]:
    """The shape of one item of ``length`` tokens for the input ``info``: its fixed dims; a free first
    (batch) dim 1, other free dims ``length``."""
    return [d if isinstance(d, int) and d > 0 else (1 if i == 0 else length)
            for i, d in enumerate(info.shape or (None, None))]


def is_mask(info: ValueInfo) -> bool:
    """An integer input made ones when no value is given: a mask (``attention_mask``, ``decoder_attention_mask``…)."""
    return not info.is_float and "mask" in info.name


def dummy_inputs(graph: Graph, length: int = 5) -> dict[str, torch.Tensor]:
    """A small input for each graph input: ``1 × length`` token ids (0), masks of ones; float
    inputs with fixed shapes as zeros (free dims: 1 for the first, ``length`` otherwise; a waveform's
    samples, a float input of rank 2, a quarter second at the export's ``rulegraph.sampling_rate``)."""
    from .audio import made_up_samples
    from .loaders.metadata import export_info
    rate = export_info(graph).sampling_rate
    feeds = {}
    for info in graph.inputs:
        wave = rate and info.is_float and info.shape is not None and len(info.shape) == 2
        dims = item_shape(info, made_up_samples(rate) if wave else length)
        if info.is_float:
            feeds[info.name] = torch.zeros(dims)
        else:
            feeds[info.name] = torch.full(dims, 1 if is_mask(info) else 0, dtype=torch.long)
    return feeds


#: the rank of the outputs of each head ``rulegraph export`` writes (``rulegraph.task``): ``[batch, classes]``,
#: span QA's ``[batch, positions]``, a language model's ``[batch, positions, vocab]``
TASK_RANKS = {"sequence-classification": 2, "image-classification": 2, "audio-classification": 2,
              "question-answering": 2, "causal-lm": 3, "image-text-to-text": 3, "seq2seq-lm": 3, "speech-seq2seq": 3}
#: one item of inputs, or a function making them (called only when a probe runs)
Feeds = Mapping[str, Tensor] | Callable[[], Mapping[str, Tensor]]


def has_positions(graph: Graph, output: str | None = None, feeds: Feeds | None = None, plan=None) -> bool:
    """Whether ``output`` (default the first) is ``[batch, positions, scores]`` (a language model's): as the
    export's task states it (:data:`TASK_RANKS`, for the outputs the export names), else as its probed kind
    says (:func:`output_kind`)."""
    from .loaders.metadata import export_info
    info = export_info(graph)
    rank = TASK_RANKS.get(info.task or "")
    if rank is not None and (output or graph.outputs[0]) in (info.outputs or graph.outputs[:1]):
        return rank == 3
    return output_kind(graph, output, feeds, plan).positions


@dataclass(frozen=True)
class OutputKind:
    """What one output scores, from the shape a probe forward gave it (:func:`output_kind`).

    Attributes:
        shape: the output's shape in the probe.
        lengths: the token counts of the probe's ``[batch, tokens]`` inputs.
        vocabulary: the rows of the largest table token ids index (``None``: no such table).
    """

    shape: tuple[int, ...]
    lengths: frozenset[int]
    vocabulary: int | None

    @property
    def positions(self) -> bool:
        """A score per position: ``[batch, positions, scores]`` (a language model)."""
        return len(self.shape) == 3

    @property
    def vocabulary_scores(self) -> bool:
        """Its last axis is the token vocabulary (a language model's head)."""
        return len(self.shape) >= 2 and self.shape[-1] == self.vocabulary

    @property
    def position_scores(self) -> bool:
        """``[batch, positions]``: a score per input position (span QA's start / end)."""
        return len(self.shape) == 2 and self.shape[-1] in self.lengths


def probe_output(graph: Graph, feeds: Mapping[str, Tensor], output: str | None = None, plan=None) -> Tensor:
    """``output`` (default the first) of one forward of ``plan`` (default the CPU float32 plan) on
    ``feeds``, and its :class:`OutputKind` kept for :func:`output_kind`."""
    from .interpreter import prepare
    output = output or graph.outputs[0]
    plan = plan or prepare(graph, "cpu", torch.float32)
    with torch.no_grad():
        out = plan.run(dict(feeds), keep=frozenset({output}))[output]       # any value of the graph
    vocabulary = max((rows for rows, _ in plan.limits.ids.values()), default=None)    # the largest table
    lengths = frozenset(int(f.shape[1]) for f in feeds.values() if isinstance(f, Tensor) and f.dim() == 2)
    graph.cache.outputs[output] = OutputKind(tuple(out.shape), lengths, vocabulary)
    return out


def output_kind(graph: Graph, output: str | None = None, feeds: Feeds | None = None,
                plan=None) -> OutputKind | None:
    """The kind of ``output`` (default the first), probed once per graph (``graph.cache.outputs``): on
    ``feeds`` (one item of real inputs, or a function making them, run by ``plan``: a forward that fails
    is the caller's error), else on a small dummy input (:func:`dummy_inputs`, 7 tokens:
    ``None`` when that cannot run)."""
    output = output or graph.outputs[0]
    if output not in graph.cache.outputs or (graph.cache.outputs[output] is None and feeds is not None):
        if feeds is not None:
            probe_output(graph, feeds() if callable(feeds) else feeds, output, plan)
        else:
            try:
                probe_output(graph, dummy_inputs(graph, length=7), output)
            except (RulegraphError, KeyError):
                graph.cache.outputs[output] = None
    return graph.cache.outputs.get(output)
