"""What a method is: its declared options, the request it answers, and the registry of baselines.

Kept apart from ``methods/__init__`` so that the baselines (``methods/baselines/``) import
these declarations without importing the package that imports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import InputError
from ..explanation import Explanation
from ..options import Option, resolve
from ..registry import Registry
from .sequences import Vocab

#: The scores of every rule set: contributions to the explained output.
RELEVANCE = "relevance (logit units)"


@dataclass
class Request:
    """What one explanation call asks for (a batch of inputs)."""

    graph: Any
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
    score: str = "logit"                     # the explained quantity: "logit" or "logprob"
    objective: Any = None                    # a rulegraph.objective.Objective explained instead


@dataclass(frozen=True)
class Method:
    """A named explanation method and what its scores are, as the evaluation and the plots read it.

    ``additive``: its scores are contributions that should add up to the explained logit
    (plotted in the conservation scatter). ``unit``: the quantity a score is ("relevance
    (logit units)", "probability drop", "attention weight"), or a function of the resolved
    options giving it. ``seeded``: it has an int option ``seed``, which ``rulegraph evaluate``
    fills from ``--seed`` unless given. ``reference``: a reference point rather than an
    attribution of the output (random scores, attention weights; drawn dashed).
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
             unit: str | Callable[[dict[str, Any]], str] = RELEVANCE, reference: bool = False):
    """Register a baseline: a function ``(request, **options) -> Explanation``."""
    seeded = any(o.name == "seed" and o.type is int for o in options)

    def register(fn):
        BASELINES.add(name, Method(name, description, fn, tuple(options), False, additive, unit, seeded,
                                   reference))
        return fn
    return register
