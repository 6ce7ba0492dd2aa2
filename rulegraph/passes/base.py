"""What every pass shares: the prologue before the walk, and the base class of a pass.

:func:`forward` is the one prologue: bind the rule set to the graph (boundary, taint, a rule
per reached node), refuse a node without a rule when the rule set says ``on_unmatched:
error``, prepare the plan, run the forward keeping what the walk reads, check the output,
and pick the explained scalar per batch item (the *seed*). A :class:`Pass` then walks the
reached nodes with its own rules and turns what it found into an
:class:`~rulegraph.explanation.Explanation`.

The explained scalar is, per batch item, one entry of the chosen output: by default the
argmax over the last axis (the predicted class), at the last position for sequence outputs
(``[batch, positions, classes]``).
"""
from __future__ import annotations

import json
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch

from ..canonize import canonize
from ..errors import InputError, NumericalError
from ..explanation import Explanation
from ..interpreter import Plan, Values, prepare
from ..ir import Graph
from ..loaders import load
from ..registry import Registry
from ..ruleset import Binding, RuleSet

Tensor = torch.Tensor


@dataclass
class Forward:
    """The prologue's result: what every pass starts its walk from."""

    graph: Graph
    ruleset: RuleSet
    binding: Binding
    plan: Plan
    values: Values                # every value the walk reads, and the run's static arguments
    output: str                   # the explained graph output
    seed: Tensor                  # one-hot selection of the explained scalar, the output's shape
    targets: list[int]            # explained index along the last axis, per batch item
    position: int | None          # explained position for sequence outputs

    @property
    def out(self) -> Tensor:
        return self.values[self.output]

    @property
    def explained(self) -> Tensor:
        """The explained scalar per batch item, in float64."""
        out = self.out
        return ((out * self.seed).flatten(1).sum(1) if out.dim() > 1 else out * self.seed).double()

    def explanation(self, relevance: dict[str, Tensor], boundary: dict[str, Tensor], audit=None) -> Explanation:
        """An :class:`Explanation` of this forward with the pass's scores."""
        return Explanation(
            output=self.output, output_tensor=self.out.detach().cpu(), target=self.targets, position=self.position,
            output_value=self.explained.tolist(), relevance=relevance, boundary=boundary,
            rules=self.ruleset.name or self.ruleset.source, audit=audit, labels=labels(self.graph))


class Pass:
    """Base class of a pass; registered in :data:`rulegraph.passes.PASSES` under the name a rule
    file's ``pass:`` gives. A pass's extra arguments (``explain(..., groups=…)``) are its
    :attr:`options`; :meth:`run` walks the reached nodes and returns the explanation."""

    name: ClassVar[str] = ""
    #: keyword arguments of ``explain`` this pass takes, with their defaults
    options: ClassVar[dict[str, Any]] = {}
    #: what becomes of relevance (or components) at a node without a rule under ``on_unmatched: warn``
    unmatched: ClassVar[str] = "relevance reaching them is dropped"

    def run(self, forward: Forward, *, audit: bool, **options: Any) -> Explanation:
        raise NotImplementedError

    @classmethod
    def resolve(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` checked against the declared ones, defaults filled in."""
        unknown = [k for k in options if k not in cls.options]
        if unknown:
            valid = ", ".join(cls.options) or "none"
            raise InputError(f"the {cls.name} pass takes no argument {unknown[0]!r}; its arguments: {valid}")
        return {**cls.options, **options}


#: pass name → :class:`Pass` subclass; a rule file's ``pass:`` names one (rulegraph.rules.RULES has its rules)
PASSES: Registry[type[Pass]] = Registry("pass", InputError)


def prepared(model: Any, rules: RuleSet | str) -> tuple[Graph, RuleSet]:
    """The graph as the rule set sees it (loaded, canonized) and the rule set (read)."""
    ruleset = rules if isinstance(rules, RuleSet) else RuleSet.load(rules)
    return canonize(load(model), ruleset.canonize), ruleset


def forward(graph: Graph, ruleset: RuleSet, inputs: dict[str, Any], target: int | Sequence[int] | None, *,
            output: str | None, position: int | None, device: str, dtype: torch.dtype,
            unmatched: str = Pass.unmatched) -> Forward:
    """The shared prologue (see the module docstring)."""
    check_arguments(inputs, target, position)
    binding = ruleset.bind(graph)
    binding.require_complete()
    if binding.unmatched and ruleset.on_unmatched == "warn":
        first = binding.unmatched[0]
        warnings.warn(f"{len(binding.unmatched)} node(s) have no rule; {unmatched} "
                      f"(first: {first.name!r}, op {first.op})", stacklevel=3)
    output = output or graph.outputs[0]
    if output not in graph.outputs:
        raise InputError(f"no graph output named {output!r}; outputs: {', '.join(graph.outputs)}")
    if output not in binding.tainted:
        raise InputError(f"output {output!r} does not depend on the relevance boundary "
                         f"({', '.join(sorted(set(binding.boundary.values())))})")
    plan = prepare(graph, device, dtype)
    values = plan.run(inputs, keep=binding.needed_values)
    out = values[output]
    if not torch.isfinite(out).all():
        raise NumericalError(f"the model's output {output!r} contains NaN or inf for these inputs")
    seed, targets, position = select(out, target, position)
    return Forward(graph, ruleset, binding, plan, values, output, seed, targets, position)


def check_arguments(inputs: Any, target: Any, position: Any) -> None:
    """The API's arguments have the types they need, before any work."""
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a dict of model input name → tensor, got a {type(inputs).__name__}")
    bad = [k for k in inputs if not isinstance(k, str)]
    if bad:
        raise InputError(f"inputs must be keyed by input name (str), got the key {bad[0]!r}")
    items = [target] if target is None or _is_index(target) else target
    if isinstance(target, (str, bytes)) or not isinstance(items, (list, tuple)) or \
            not all(t is None and target is None or _is_index(t) for t in items):
        raise InputError(f"target must be a class index (int) or a list of them, one per batch item; got {target!r}")
    if position is not None and not _is_index(position):
        raise InputError(f"position must be an int, got {position!r}")


def _is_index(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) or \
        isinstance(value, Tensor) and value.dim() == 0 and not value.is_floating_point()


def select(out: Tensor, target, position) -> tuple[Tensor, list[int], int | None]:
    """One-hot selection of the explained scalar per batch item, the targets and the position."""
    shape = out.shape
    if out.dim() == 1:
        out = out.unsqueeze(-1)
    batch = out.shape[0]
    picked = out
    if out.dim() == 3:
        if position is None:
            position = out.shape[1] - 1
        if not 0 <= position < out.shape[1]:
            raise InputError(f"position {position} is out of range; the output has {out.shape[1]} positions "
                             f"(0…{out.shape[1] - 1})")
        picked = out[:, position]
    elif position is not None:
        raise InputError(f"position {position} was given, but the output (shape {tuple(shape)}) has no positions; "
                         "it applies to [batch, positions, classes] outputs")
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
        bad = [t for t in targets if not 0 <= t < classes]
        if bad:
            raise InputError(f"target {bad[0]} is out of range; the output has {classes} classes (0…{classes - 1})")
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


def labels(graph: Graph) -> list[str] | None:
    """The class labels an export recorded in its metadata (``rulegraph.labels``), if any."""
    raw = graph.metadata.get("rulegraph.labels")
    if not raw:
        return None
    try:
        found = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return [str(x) for x in found] if isinstance(found, list) else None
