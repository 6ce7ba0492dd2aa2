"""What a method is: its declared options, the request it answers, and the registry of baselines.

Kept apart from ``methods/__init__`` so that the baselines (``methods/baselines/``) import
these declarations without importing the package that imports them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import InputError, choices
from ..explanation import Explanation
from ..registry import Registry
from .sequences import Vocab

#: The scores of every rule set: contributions to the explained output.
RELEVANCE = "relevance (logit units)"


@dataclass(frozen=True)
class Option:
    """A declared method option: its type, default and (optionally) the valid choices."""

    name: str
    type: type
    default: Any
    help: str = ""
    choices: tuple = ()

    def parse(self, method: str, value: Any) -> Any:
        if value is None and self.default is None:      # an option that is unset by default
            return None
        if isinstance(value, str) and self.type is not str:
            try:
                value = self.type(value)
            except ValueError:
                raise InputError(f"option {method}.{self.name} must be {self.type.__name__}, got {value!r}") from None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or isinstance(value, bool) != (self.type is bool):
            raise InputError(f"option {method}.{self.name} must be {self.type.__name__}, got {value!r}")
        if self.choices and value not in self.choices:
            raise InputError(f"option {method}.{self.name}: {value!r} is not valid; "
                             f"{choices([str(c) for c in self.choices], str(value))}")
        return value


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
    score: str = "logit"                     # "logit" or "logprob"
    objective: Any = None                    # a rulegraph.objective.Objective explained instead


@dataclass(frozen=True)
class Method:
    """A named explanation method and what its scores are, as the evaluation and the plots read it.

    ``additive``: its scores are contributions that should add up to the explained logit
    (plotted in the conservation scatter). ``score``: the quantity a score is ("relevance
    (logit units)", "probability drop", "attention weight"), or a function of the resolved
    options giving it. ``seeded``: it has an int option ``seed``, which ``rulegraph evaluate``
    fills from ``--seed`` unless given. ``reference``: a reference point rather than an
    attribution of the output (random scores, attention weights; drawn dashed).
    """

    name: str
    description: str
    run: Callable[..., Explanation]
    options: tuple[Option, ...] = ()
    kind: str = "baseline"              # "baseline" or "rules"
    additive: bool = False
    score: str | Callable[[dict[str, Any]], str] = RELEVANCE
    seeded: bool = False
    reference: bool = False

    def resolve(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` checked against the declared ones, with the defaults filled in."""
        declared = {o.name: o for o in self.options}
        unknown = [k for k in options if k not in declared]
        if unknown:
            valid = choices(list(declared), unknown[0]) if declared else "it takes no options"
            raise InputError(f"method {self.name!r} has no option {unknown[0]!r}; {valid}")
        return {name: o.parse(self.name, options[name]) if name in options else o.default
                for name, o in declared.items()}

    def quantity(self, options: dict[str, Any] | None = None) -> str:
        """What this method's scores are, under ``options`` (the defaults when not given)."""
        if callable(self.score):
            return self.score(self.resolve(options or {}))
        return self.score


#: The baselines by name, in registration order (the import order of ``methods/baselines/``).
BASELINES: Registry[Method] = Registry("method", InputError)


def baseline(name: str, description: str, *options: Option, additive: bool = False,
             score: str | Callable[[dict[str, Any]], str] = RELEVANCE, reference: bool = False):
    """Register a baseline: a function ``(request, **options) -> Explanation``."""
    seeded = any(o.name == "seed" and o.type is int for o in options)

    def register(fn):
        BASELINES.add(name, Method(name, description, fn, tuple(options), "baseline", additive, score, seeded,
                                   reference))
        return fn
    return register
