"""Per-step attribution of an encoder–decoder's output: for each generated token, the relevance of
every source token and of every token of the target prefix, and the source-vs-prefix share
(Yang et al. 2023, "Local interpretation of transformer based on linear decomposition", ACL,
Sec. 4.2, Fig. 4–5).

The model is an export taking ``input_ids`` / ``attention_mask`` (the source) and
``decoder_input_ids`` (the target prefix, starting with the decoder's start token) and giving
logits ``[batch, target positions, vocabulary]`` (``rulegraph.exporters.HFSeq2SeqLM``). Step t
explains the logit at decoder position t of the token generated there (``targets[t]``, default
the argmax: with the prefix a greedy decoding produced, that is the token generated next). Every
rule set works: the relevance passes read the relevance at the encoder's and the decoder's token
embeddings, the decomposition pass lays the source rows and the prefix rows end to end
(:class:`rulegraph.passes.decomposition.Rows`). Causal attention leaves the prefix rows after
position t with no relevance at step t.

The result is a matrix: rows = source tokens followed by the target prefix, columns = the
generated tokens (:class:`Steps`), the one shape a renderer of per-step attributions needs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .api import explain
from .errors import InputError
from .interpreter import prepare
from .loaders import load
from .passes import prepared
from .passes.base import check_arguments

Tensor = torch.Tensor

SOURCE, PREFIX = "input_ids", "decoder_input_ids"


@dataclass
class Steps:
    """Relevance of each row (``sources`` source tokens, then the target prefix) for each generated
    token (a column), with each step's conservation figures."""

    rows: list[str]               # row labels: the source tokens, then the target prefix
    sources: int                  # rows 0…sources−1 are the source
    columns: list[str]            # generated tokens, one per step
    targets: list[int]            # their ids
    scores: Tensor                # [rows, columns], float64
    explained: list[float]        # the explained scalar per step (the logit, or as ``score=`` says)
    absorbed: list[float]         # per step: relevance absorbed by constants (or the bias component)
    breaks: list[float]           # per step: relevance lost at non-conserving rules by design
    residual: list[float]         # per step: explained − rows − absorbed − breaks (the audit's residual)
    rules: str = ""

    @property
    def source(self) -> Tensor:
        """Σ over the source rows, per step."""
        return self.scores[:self.sources].sum(0)

    @property
    def prefix(self) -> Tensor:
        """Σ over the target-prefix rows, per step."""
        return self.scores[self.sources:].sum(0)

    def shares(self) -> Tensor:
        """``[2, steps]``: the source's and the target prefix's share of each step's contribution,
        |S| / (|S| + |P|) and |P| / (|S| + |P|) with S and P the summed relevance of the source and
        of the prefix (Yang et al. 2023, Sec. 4.2, Fig. 4 plots the prefix's in %). The paper does
        not say how signs enter; the magnitudes of the two totals keep each share in [0, 1]. NaN
        where both totals are 0."""
        s, p = self.source.abs(), self.prefix.abs()
        total = s + p
        undefined = total == 0
        safe = torch.where(undefined, torch.ones_like(total), total)
        out = torch.stack([s / safe, p / safe])
        out[:, undefined] = float("nan")
        return out

    def to_dict(self) -> dict[str, Any]:
        shares = self.shares()
        return {"rules": self.rules, "rows": self.rows, "sources": self.sources, "columns": self.columns,
                "targets": self.targets, "scores": self.scores.tolist(), "explained": self.explained,
                "absorbed": self.absorbed, "breaks": self.breaks, "residual": self.residual,
                "source_share": _finite(shares[0]), "prefix_share": _finite(shares[1])}


def _finite(values: Tensor) -> list[float | None]:
    return [None if v != v else v for v in values.tolist()]


def explain_steps(model: Any, rules: Any, inputs: dict[str, Any], targets: Sequence[int] | None = None, *,
                  output: str | None = None, labels: Callable[[int], str] | None = None, device: str = "cpu",
                  dtype: torch.dtype = torch.float32, **options: Any) -> Steps:
    """Explain each decoder position of ``model`` for ``inputs`` (one source, one target prefix) and
    return the :class:`Steps` matrix.

    ``targets``: the generated token at each decoder position (default: the argmax there).
    ``labels``: token id → text for the row and column labels (default: the id). ``options`` go to
    :func:`rulegraph.explain` (``score=``, ``contrast=``, a decomposition's ``alpha``…).
    """
    check_arguments(inputs, None, None)
    graph, ruleset = prepared(model, rules)
    missing = [name for name in (SOURCE, PREFIX) if name not in graph.input_names]
    if missing:
        raise InputError(f"per-step attribution needs an encoder–decoder export with inputs {SOURCE} and {PREFIX}; "
                         f"this model's inputs are {', '.join(graph.input_names)}")
    source, prefix = (torch.as_tensor(inputs.get(name)) if name in inputs else None for name in (SOURCE, PREFIX))
    if source is None or prefix is None:
        raise InputError(f"give the source ({SOURCE}) and the target prefix ({PREFIX}) among the inputs")
    if source.dim() != 2 or prefix.dim() != 2 or source.shape[0] != 1 or prefix.shape[0] != 1:
        raise InputError(f"per-step attribution takes one source and one prefix, [1, tokens] each; got {SOURCE} "
                         f"{tuple(source.shape)} and {PREFIX} {tuple(prefix.shape)}")
    steps = prefix.shape[1]
    if targets is not None and len(targets) != steps:
        raise InputError(f"got {len(targets)} targets for {steps} decoder positions; give one per position")
    label = labels or str
    sources = source.shape[1]
    scores = torch.zeros(sources + steps, steps, dtype=torch.float64)
    explained, absorbed, breaks, residual, chosen = [], [], [], [], []
    for t in range(steps):
        e = explain(graph, ruleset, inputs, None if targets is None else int(targets[t]), output=output, position=t,
                    device=device, dtype=dtype, **options)
        scores[:sources, t] = e.relevance[SOURCE][0].double().cpu()
        scores[sources:, t] = e.relevance[PREFIX][0].double().cpu()
        c = e.audit.conservation
        explained.append(c.output_value)
        absorbed.append(c.absorbed)
        breaks.append(c.breaks)
        residual.append(c.residual)
        chosen.append(e.target[0])
    rows = [label(int(i)) for i in source[0].tolist()] + [label(int(i)) for i in prefix[0].tolist()]
    return Steps(rows, sources, [label(t) for t in chosen], chosen, scores, explained, absorbed, breaks, residual,
                 ruleset.name or ruleset.source)


def greedy(model: Any, inputs: dict[str, Any], steps: int, start: int, *, output: str | None = None,
           device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Tensor, list[int]]:
    """Greedy decoding with the exported graph: the target prefix ``[[start, y_1, …, y_{steps−1}]]``
    and the generated tokens ``[y_1, …, y_steps]`` (each the argmax of the logits at the last
    position, given the prefix before it). The prefix is what :func:`explain_steps` takes."""
    if not isinstance(steps, int) or steps < 1:
        raise InputError(f"steps must be a positive int, got {steps!r}")
    graph = load(model)
    plan = prepare(graph, device, dtype)
    output = output or graph.outputs[0]
    prefix = torch.tensor([[int(start)]])
    generated: list[int] = []
    for _ in range(steps):
        logits = plan.run({**inputs, PREFIX: prefix}, keep=frozenset())[output]
        generated.append(int(logits[0, -1].argmax()))
        if len(generated) < steps:
            prefix = torch.cat([prefix, torch.tensor([[generated[-1]]])], 1)
    return prefix, generated
