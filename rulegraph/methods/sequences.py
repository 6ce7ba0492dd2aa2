"""Token sequences as model inputs: the tokenizer's special ids, token removal, and batched
forwards of many (perturbed) sequences through one prepared plan.

Used by the perturbation baselines (leave-one-out) and by ``rulegraph evaluate``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..errors import InputError
from ..facts import roles, token_feeds, token_input  # noqa: F401  (token_input re-exported)
from ..interpreter import prepare
from ..ir import Graph, Node
from ..sessions import NUMPY, file_source, onnx_file, session
from ..tokens import RUNTIMES, REMOVALS, ZERO, Tokens, Vocab  # noqa: F401  (re-exported)

Tensor = torch.Tensor


def batch(graph: Graph, encoded: Sequence, pad: int) -> tuple[dict[str, Tensor], Tensor]:
    """The graph's inputs for encoded texts (:class:`rulegraph.text.Encoded`) padded on the right to
    the longest with ``pad`` (the token ids, and ``attention_mask`` / ``token_type_ids`` where the
    graph has them), and the ``[batch, tokens]`` mask of positions never perturbed (special tokens
    and padding)."""
    width = max(len(e.tokens) for e in encoded)
    ids = torch.full((len(encoded), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(encoded), width), dtype=torch.int64)
    types = torch.zeros((len(encoded), width), dtype=torch.int64)
    special = torch.ones((len(encoded), width), dtype=torch.bool)
    for b, e in enumerate(encoded):
        n = len(e.tokens)
        ids[b, :n] = e.inputs["input_ids"][0]
        mask[b, :n] = 1
        types[b, :n] = e.inputs["token_type_ids"][0]
        special[b, :n] = torch.tensor(e.special)
    token_input(graph)              # a model without a token id input is refused
    return token_feeds(graph, ids, mask=mask, types=types), special


def resolve_runtime(runtime: str, graph: Graph, device: str, dtype: torch.dtype, zeroed: bool = False,
                    output: str | None = None) -> str:
    """``runtime`` with ``auto`` decided; an explicit ``onnxruntime`` that cannot run is an input error.
    ``zeroed``: sequences may hold zero embeddings, which only the interpreter can feed. ``output`` (default
    the graph's first): the value read, which the file must compute (a final Softmax's logits are not its
    output, but onnxruntime returns them where the file names them)."""
    if runtime not in RUNTIMES:
        raise InputError(f"unknown runtime {runtime!r}; valid: {', '.join(RUNTIMES)}")
    if zeroed and runtime == "onnxruntime":
        raise InputError("removal 'zero' feeds zero embeddings inside the graph, which the onnxruntime runtime "
                         "cannot; use --runtime rulegraph or auto")
    possible = onnx_file(graph) is not None and str(device) == "cpu" and dtype == torch.float32 and not zeroed \
        and file_source(graph, output or graph.outputs[0]) is not None
    if runtime == "auto":
        return "onnxruntime" if possible else "rulegraph"
    if runtime == "onnxruntime" and not possible:
        raise InputError("the onnxruntime runtime needs a model loaded from an .onnx file that computes the "
                         "explained value, on the CPU, in float32")
    return runtime


def fixed_batch(graph: Graph) -> int | None:
    """The batch size an export fixed (a number, not a name, at dim 0 of its inputs), else None: a
    method that batches rows of its own (IG's steps, perturbed sequences) runs exactly that many."""
    sizes = {i.shape[0] for i in graph.inputs if i.shape and isinstance(i.shape[0], int) and i.shape[0] > 0}
    return min(sizes) if sizes else None


def zero_embedding_lookup(graph: Graph) -> Node:
    """The token-embedding Gather a ``zero`` removal overrides (see :class:`TokenModel`): the token table's
    lookup (:attr:`rulegraph.facts.Roles.table`), where it is a Gather of a float table."""
    found = roles(graph).table
    if found is None or found.node.op != "Gather" or found.node.inputs[0] not in graph.constants:
        raise InputError("removal 'zero' needs a token-embedding lookup (a Gather of a constant table by the token "
                         "ids); the model has none")
    return found.node


class TokenModel:
    """Runs lists of :class:`Tokens` through the graph's plan (or onnxruntime: ``runtime``, see
    :data:`RUNTIMES`) in padded batches and returns the chosen output's ``[N, classes]`` logits
    (float64, CPU), in the order given. For a causal LM (a ``[batch, positions, vocabulary]``
    output) these are the next-token logits after each sequence's last token.

    A position holding :data:`~rulegraph.tokens.ZERO` (a ``zero`` removal) is fed a zero token
    embedding: the id there becomes the [PAD] id, and the output of the token-embedding lookup
    (:func:`zero_embedding_lookup`) is overridden with its rows at those positions set to 0, as
    ``inputs_embeds`` with zero rows would be in Hugging Face (position and token-type embeddings
    are still added where the model adds them). Such sequences run through the interpreter; with
    ``zeroed=True`` (sequences may hold ZERO) ``runtime="auto"`` takes it for every sequence, so that
    perturbed and unperturbed forwards are computed alike.

    Sequences are sorted by length and cut into batches of at most ``batch_tokens`` padded
    tokens (and ``max_rows`` rows). Padding uses the [PAD] id with attention mask 0; a model
    without an ``attention_mask`` input only gets batches of equal lengths.
    """

    def __init__(self, graph: Graph, *, output: str | None = None, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, pad_id: int | None = 0, batch_tokens: int = 8192,
                 max_rows: int = 256, runtime: str = "rulegraph", zeroed: bool = False):
        self.graph = graph
        self.output = output or graph.outputs[0]
        self.runtime = resolve_runtime(runtime, graph, device, dtype, zeroed, self.output)
        self.lookup = zero_embedding_lookup(graph) if zeroed else None
        self.plan = prepare(graph, device, dtype) if self.runtime == "rulegraph" else None
        self.session = session(graph, self.output) if self.runtime == "onnxruntime" else None
        self.ids = token_input(graph)
        names = [i.name for i in graph.inputs]
        self.mask, self.types = roles(graph).mask, roles(graph).types
        other = [n for n in names if n not in (self.ids, self.mask, self.types)]
        if other:
            raise InputError(f"cannot feed the model's input(s) {', '.join(other)} from token sequences")
        self.pad_id = 0 if pad_id is None else pad_id
        self.batch_tokens = batch_tokens
        self.fixed = fixed_batch(graph)             # a batch the export fixed: batches are padded to it
        self.max_rows = max_rows if self.fixed is None else self.fixed
        self.forwards = 0           # sequences run so far
        self.seconds = 0.0
        if self.lookup is not None:
            self._check_lookup()

    def _check_lookup(self) -> None:
        """The lookup's output must be ``[batch, tokens, hidden]`` in the ids' order, which the override
        assumes: true when it reads the ids directly or through ops that keep their order and shape (a
        Cast, GPT-2's Reshape to ``[-1, tokens]``); one probe forward of a ``[2, 3]`` batch checks it."""
        value = self.lookup.outputs[0]
        with torch.no_grad():
            probe = self.plan.run(self.feeds([Tokens((self.pad_id,) * 3)] * 2), keep=frozenset({value}))[value]
        if tuple(probe.shape[:2]) != (2, 3) or probe.dim() != 3:
            raise InputError(f"removal 'zero' overrides the token-embedding lookup {self.lookup.name!r}, whose output "
                             f"is not [batch, tokens, hidden] (shape {tuple(probe.shape)} for 2 × 3 tokens); use "
                             "another --removal")

    def batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices grouped into padded batches (by increasing length)."""
        order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            longest = lengths[i]
            fits = current and (len(current) + 1) * longest <= self.batch_tokens and len(current) < self.max_rows
            same = current and lengths[current[0]] == longest
            if current and not (fits and (self.mask is not None or same)):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def feeds(self, seqs: Sequence[Tokens]) -> dict[str, Tensor]:
        """The graph inputs for one padded batch."""
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(seqs), width), dtype=torch.int64)
        types = torch.zeros((len(seqs), width), dtype=torch.int64)
        for row, s in enumerate(seqs):
            ids[row, :len(s)] = torch.tensor(s.ids, dtype=torch.int64)
            mask[row, :len(s)] = 1
            if s.types is not None:
                types[row, :len(s)] = torch.tensor(s.types, dtype=torch.int64)
        return token_feeds(self.graph, ids, mask=mask, types=types)

    def __call__(self, seqs: Sequence[Tokens]) -> Tensor:
        import time
        if not seqs:
            return torch.zeros((0, 0), dtype=torch.float64)
        started = time.perf_counter()
        rows: list[Tensor | None] = [None] * len(seqs)
        with torch.no_grad():
            for batch in self.batches([len(s) for s in seqs]):
                rows_run = [seqs[i] for i in batch]
                rows_run += rows_run[-1:] * ((self.fixed or 0) - len(rows_run))      # copies, dropped below
                feeds = self.feeds(rows_run)
                out = self._forward(feeds, self._zeroed(feeds))
                if out.dim() not in (2, 3):
                    raise InputError(f"output {self.output!r} has shape {tuple(out.shape)}; token perturbation "
                                     "needs a [batch, classes] or a causal LM's [batch, positions, vocabulary] output")
                out = out.detach().to("cpu", torch.float64)
                for k, i in enumerate(batch):
                    rows[i] = out[k] if out.dim() == 2 else out[k, len(seqs[i]) - 1]
        self.forwards += len(seqs)
        self.seconds += time.perf_counter() - started
        return torch.stack(rows)

    def _zeroed(self, feeds: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """The override of the token-embedding lookup for the positions holding ZERO (which become the
        [PAD] id in ``feeds``), or ``None`` where there are none."""
        ids = feeds[self.ids]
        zero = ids == ZERO
        if not bool(zero.any()):
            return None
        if self.lookup is None:
            raise InputError("a sequence holds zero-embedding positions (removal 'zero'), but the model runner "
                             "was not made for them (TokenModel(zeroed=True))")
        ids[zero] = self.pad_id
        table = self.plan.constants[self.lookup.inputs[0]]
        rows = table[ids.to(table.device)]
        rows[zero.to(rows.device)] = 0
        return {self.lookup.outputs[0]: rows}

    def next_token(self, seq: Tokens) -> bool:
        """Whether the output has a positions axis (a causal LM: explained at the last token)."""
        with torch.no_grad():
            return self._forward(self.feeds([seq] * (self.fixed or 1))).dim() == 3

    def _forward(self, feeds: dict[str, Tensor], overrides: dict[str, Tensor] | None = None) -> Tensor:
        """The chosen output for one padded batch, from onnxruntime or the plan (``overrides``: values
        the plan uses instead of computing them)."""
        if self.session is not None:
            arrays = {i.name: feeds[i.name].numpy().astype(NUMPY.get(i.type, "int64"))
                      for i in self.session.get_inputs()}
            return torch.from_numpy(self.session.run([self.output], arrays)[0])
        return self.plan.run(feeds, keep=frozenset(), overrides=overrides)[self.output]
