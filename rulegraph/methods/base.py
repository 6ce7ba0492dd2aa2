"""What a method is: its declared options, the request it answers, and the registry of baselines.

Every method reaches the graph through one prologue, :meth:`Method.prepared`: the model loaded
and canonized as the method's rule set asks (:func:`rulegraph.passes.prepared`; a baseline's
is ``gi`` unless it declares another), so a quantized graph reaches every method as the float
computation it stands for (:mod:`rulegraph.quantization`). The :class:`Request` a method runs
on holds that graph, the rule set, its :attr:`~Request.binding` (bound once per graph) and
:attr:`~Request.plan`: a baseline reads these and never loads, canonizes or binds a graph itself.

Kept apart from ``methods/__init__`` so that the baselines (``methods/baselines/``) import
these declarations without importing the package that imports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import InputError
from ..explanation import Explanation
from ..interpreter import Plan, prepare
from ..ir import Graph
from ..options import Option, resolve
from ..passes import prepared
from ..registry import Registry
from ..ruleset import Binding, RuleSet
from .sequences import Vocab

#: The scores of every rule set: contributions to the explained output.
RELEVANCE = "relevance (logit units)"


@dataclass
class Request:
    """What one explanation call asks for (a batch of inputs), on the graph as the method's rule
    set sees it (:meth:`Method.prepared`)."""

    graph: Graph
    inputs: dict[str, torch.Tensor]
    target: int | list[int] | None = None
    output: str | None = None
    position: int | None = None
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    special: torch.Tensor | None = None     # [batch, tokens] bool: [CLS], [SEP]… (never perturbed)
    vocab: Vocab | None = None
    audit: bool = True
    contrast: int | list[int] | None = None  # subtracted class (rulegraph.passes.base.select)
    score: str = "logit"                     # the explained quantity: "logit" or "logprob" ("probability": a baseline
                                             # explains a final Softmax's output, not the logits before it)
    objective: Any = None                    # a rulegraph.objective.Objective explained instead
    ruleset: RuleSet | None = None           # the rule set ``graph`` was canonized for

    @property
    def binding(self) -> Binding:
        """The request's rule set bound to the graph (:meth:`bind`)."""
        return self.bind()

    def bind(self, ruleset: RuleSet | None = None) -> Binding:
        """``ruleset`` (default the request's) bound to the graph, complete; refused unless it asks for
        the canonizers the graph was prepared with. Bound once per graph and rule set (the binding is
        held in the graph's cache)."""
        if self.ruleset is None:
            raise InputError("this request has no rule set to bind; build it with Method.prepared")
        ruleset = ruleset or self.ruleset
        if tuple(ruleset.canonize) != tuple(self.ruleset.canonize):
            raise InputError(f"rule set {ruleset.name or ruleset.source} asks for the canonizers "
                             f"{list(ruleset.canonize)}; the graph was prepared for {list(self.ruleset.canonize)} "
                             f"({self.ruleset.name or self.ruleset.source})")
        binding = ruleset.bind(self.graph)
        binding.require_complete()
        return binding

    @property
    def plan(self) -> Plan:
        """The graph's plan for the request's device and dtype (built once per graph)."""
        return prepare(self.graph, self.device, self.dtype)


@dataclass(frozen=True)
class Method:
    """A named explanation method and what its scores are, as the evaluation and the plots read it.

    ``additive``: its scores are contributions that should add up to the explained logit
    (plotted in the conservation scatter). ``unit``: the quantity a score is ("relevance
    (logit units)", "probability drop", "attention weight"), or a function of the resolved
    options giving it. ``seeded``: it has an int option ``seed``, which ``rulegraph evaluate``
    fills from ``--seed`` unless given. ``reference``: a reference point rather than an
    attribution of the output (random scores, attention weights; drawn dashed). ``rules``: the rule
    set (a name, a path or a :class:`RuleSet`) whose canonizers prepare the graph and whose
    binding the method reads (a rule set's own; ``gi`` for a baseline unless it declares another).
    """

    name: str
    description: str
    run: Callable[..., Explanation]
    options: tuple[Option, ...] = ()
    rule_set: bool = False              # a rule set (rulegraph.explain); otherwise a baseline
    additive: bool = False
    unit: str | Callable[[dict[str, Any]], str] = RELEVANCE
    seeded: bool = False
    reference: bool = False
    rules: str | RuleSet = "gi"

    def ruleset(self) -> RuleSet:
        """The rule set the method reaches the graph through (read)."""
        return self.rules if isinstance(self.rules, RuleSet) else RuleSet.load(self.rules)

    def prepared(self, model: Any) -> tuple[Graph, RuleSet]:
        """The one prologue: ``model`` loaded and canonized as :meth:`ruleset` asks, and the rule set."""
        return prepared(model, self.ruleset())

    def resolve(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` checked against the declared ones, with the defaults filled in."""
        return resolve(self.options, options, self.name)

    def units(self, options: dict[str, Any] | None = None) -> str:
        """What this method's scores are, under ``options`` (the defaults when not given)."""
        if callable(self.unit):
            return self.unit(self.resolve(options or {}))
        return self.unit


#: The baselines by name, in registration order (the import order of ``methods/baselines/``).
BASELINES: Registry[Method] = Registry("method", InputError)


def baseline(name: str, description: str, *options: Option, additive: bool = False,
             unit: str | Callable[[dict[str, Any]], str] = RELEVANCE, reference: bool = False, rules: str = "gi"):
    """Register a baseline: a function ``(request, **options) -> Explanation``, handed the graph as the
    rule set ``rules`` sees it (canonized) with that rule set's binding (:class:`Request`)."""
    seeded = any(o.name == "seed" and o.type is int for o in options)

    def register(fn):
        BASELINES.add(name, Method(name, description, fn, tuple(options), False, additive, unit, seeded,
                                   reference, rules))
        return fn
    return register
