"""``explain``: forward, pick the output scalar(s), run the relevance pass, audit.

The explained scalar is, per batch item, one entry of the chosen output: by default
the argmax over the last axis (the predicted class), at the last position for
sequence outputs (``[batch, positions, classes]``). Relevance starts there as the
output's value and is read at the boundary (see :class:`~rulegraph.ruleset.Boundary`);
per-position scores sum the boundary relevance over the hidden dimension.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .audit import TOLERANCE, Audit, build_audit
from .errors import InputError, NumericalError
from .interpreter import prepare
from .ir import Graph
from .canonize import canonize
from .loaders import load
from .relevance import finish, propagate
from .ruleset import Binding, RuleSet

Tensor = torch.Tensor


@dataclass
class Explanation:
    """Relevance of each input position for the explained output scalar(s), plus the audit."""

    output: str                          # name of the explained graph output
    output_tensor: Tensor                # its full value (batch first)
    target: list[int]                    # explained index along the last axis, per batch item
    position: int | None                 # explained position for sequence outputs
    output_value: list[float]            # the explained scalar per batch item
    relevance: dict[str, Tensor]         # boundary key (input name) → per-position scores
    boundary: dict[str, Tensor]          # boundary key → full relevance tensor (e.g. batch × tokens × hidden)
    rules: str
    audit: Audit | None = None
    tokens: list[list[str]] | None = None
    labels: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return len(self.target)

    def scores(self, key: str | None = None, item: int = 0) -> list[float]:
        """Per-position scores of batch item ``item`` for one boundary key (default: the first)."""
        key = key or next(iter(self.relevance))
        return self.relevance[key][item].reshape(-1).tolist()

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "rules": self.rules,
            "output": self.output,
            "target": self.target if self.batch_size > 1 else self.target[0],
            "output_value": self.output_value if self.batch_size > 1 else self.output_value[0],
            "relevance": {k: (v.tolist() if self.batch_size > 1 else v[0].tolist()) for k, v in self.relevance.items()},
        }
        if self.position is not None:
            d["position"] = self.position
        if self.labels:
            d["labels"] = self.labels
        if self.tokens is not None:
            d["tokens"] = self.tokens if self.batch_size > 1 else self.tokens[0]
        if self.audit is not None:
            d.update(self.audit.to_dict())
        d.update(self.extra)
        return d


def bind(graph: Graph, rules: RuleSet) -> Binding:
    """The graph's :class:`Binding` to ``rules`` (computed once per rule set object)."""
    cache = graph.__dict__.setdefault("_bindings", {})
    key = id(rules)
    if key not in cache or cache[key][0] is not rules:
        cache[key] = (rules, rules.bind(graph))
    return cache[key][1]


def explain(model: Any, rules: RuleSet | str, inputs: dict[str, Any], target: int | Sequence[int] | None = None, *,
            output: str | None = None, position: int | None = None, device: str = "cpu",
            dtype: torch.dtype = torch.float32, audit: bool = True) -> Explanation:
    """Explain ``model``'s output for ``inputs`` with a rule set.

    ``model``: a :class:`Graph` or anything :func:`rulegraph.load` takes. ``rules``: a
    :class:`RuleSet` or a shipped name / YAML path. ``target``: the class index (one
    for all items, or one per item); default the argmax. ``output``: which graph
    output (default the first). ``position``: for ``[batch, positions, classes]``
    outputs, the position explained (default the last). A rule set with
    ``pass: decomposition`` runs :func:`rulegraph.decomposition.decompose` (per-token groups).
    """
    graph = load(model)
    ruleset = rules if isinstance(rules, RuleSet) else RuleSet.load(rules)
    graph = canonize(graph, ruleset.canonize)
    if ruleset.pass_name == "decomposition":  # a forward pass with G+1 components (rulegraph.decomposition)
        from .decomposition import decompose
        return decompose(graph, ruleset, inputs, target, output=output, position=position, device=device,
                         dtype=dtype, audit=audit)
    binding = bind(graph, ruleset)
    binding.require_complete()
    if binding.unmatched and ruleset.on_unmatched == "warn":
        warnings.warn(f"{len(binding.unmatched)} node(s) have no rule; relevance reaching them is dropped "
                      f"(first: {binding.unmatched[0].name!r}, op {binding.unmatched[0].op})", stacklevel=2)
    plan = prepare(graph, device, dtype)
    output = output or graph.outputs[0]
    if output not in graph.outputs:
        raise InputError(f"no graph output named {output!r}; outputs: {', '.join(graph.outputs)}")

    env = plan.run(inputs, keep=binding.needed_values)
    out = env[output]
    if not torch.isfinite(out).all():
        raise NumericalError(f"the model's output {output!r} contains NaN or inf for these inputs")
    seed, targets, position = _seed(out, target, position)
    if output not in binding.tainted:
        raise InputError(f"output {output!r} does not depend on the relevance boundary "
                         f"({', '.join(sorted(set(binding.boundary.values())))})")

    flow = propagate(binding, plan, env, output, seed, audit=audit, tolerance=TOLERANCE.get(dtype, 1e-4))
    if audit:
        finish(flow)
    boundary: dict[str, Tensor] = {}
    for value, key in binding.boundary.items():
        r = flow.boundary.get(value)
        if r is None:
            r = torch.zeros_like(env[value])
        boundary[key] = boundary[key] + r if key in boundary else r
    for key, r in boundary.items():
        if not torch.isfinite(r).all():
            raise NumericalError(f"relevance at {key!r} contains NaN or inf; a rule divided by a zero activation "
                                 "or an input was infinite — try the epsilon rule")
    explained = (out * seed).flatten(1).sum(1) if out.dim() > 1 else (out * seed)
    return Explanation(
        output=output, output_tensor=out.detach().cpu(), target=targets, position=position,
        output_value=explained.double().tolist(),
        relevance={k: position_scores(v).detach().cpu() for k, v in boundary.items()},
        boundary={k: v.detach().cpu() for k, v in boundary.items()},
        rules=ruleset.name or ruleset.source,
        audit=build_audit(flow, binding, dtype) if audit else None,
        labels=_labels(graph))


def _seed(out: Tensor, target, position) -> tuple[Tensor, list[int], int | None]:
    """One-hot selection of the explained scalar per batch item."""
    shape = out.shape
    if out.dim() == 1:
        out = out.unsqueeze(-1)
    batch = out.shape[0]
    picked = out
    if out.dim() == 3:
        position = -1 if position is None else position
        if not -out.shape[1] <= position < out.shape[1]:
            raise InputError(f"--position {position} is outside the output's {out.shape[1]} positions")
        picked = out[:, position]
    elif out.dim() != 2:
        raise InputError(f"cannot pick a target in an output of shape {tuple(out.shape)}; "
                         "expected [batch, classes] or [batch, positions, classes]")
    classes = picked.shape[-1]
    if target is None:
        targets = picked.argmax(-1).tolist()
    else:
        targets = [int(target)] * batch if isinstance(target, int) else [int(t) for t in target]
        if len(targets) != batch:
            raise InputError(f"got {len(targets)} targets for a batch of {batch}")
        bad = [t for t in targets if not -classes <= t < classes]
        if bad:
            raise InputError(f"target {bad[0]} is out of range; the output has {classes} classes (0…{classes - 1})")
        targets = [t % classes for t in targets]
    seed = torch.zeros_like(picked)
    seed[torch.arange(batch), targets] = 1
    if out.dim() == 3:
        full = torch.zeros_like(out)
        full[:, position] = seed
        seed = full
    return seed.reshape(shape), targets, position


def position_scores(r: Tensor) -> Tensor:
    """Per-position scores: sum over the hidden dim of ``[batch, positions, hidden]``,
    over channels of images ``[batch, channels, h, w]``; other shapes as they are."""
    if r.dim() == 3:
        return r.sum(-1)
    if r.dim() == 4:
        return r.sum(1)
    return r


def _labels(graph: Graph) -> list[str] | None:
    import json
    raw = graph.metadata.get("rulegraph.labels")
    if not raw:
        return None
    try:
        labels = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return [str(x) for x in labels] if isinstance(labels, list) else None
