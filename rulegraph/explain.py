"""``explain``: the one public entry, whatever the pass.

Load the model, read the rule set, apply its canonizers, run the shared prologue
(:func:`rulegraph.passes.forward`), then the pass the rule set names (``pass:``, default
``relevance``). Per-position scores sum the boundary relevance over the hidden dimension
(images: over the channels).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from .explanation import Explanation
from .passes import PASSES, forward, prepared
from .ruleset import RuleSet

__all__ = ["Explanation", "explain", "prepared"]


def explain(model: Any, rules: RuleSet | str, inputs: dict[str, Any], target: int | Sequence[int] | None = None, *,
            output: str | None = None, position: int | None = None, device: str = "cpu",
            dtype: torch.dtype = torch.float32, audit: bool = True, **options: Any) -> Explanation:
    """Explain ``model``'s output for ``inputs`` with a rule set.

    ``model``: a :class:`~rulegraph.Graph` or anything :func:`rulegraph.load` takes. ``rules``:
    a :class:`~rulegraph.RuleSet` or a shipped name / YAML path. ``target``: the class index
    (one for all items, or one per item); default the argmax. ``output``: which graph output
    (default the first). ``position``: for ``[batch, positions, classes]`` outputs, the
    position explained (default the last). ``options``: the pass's own arguments, e.g. for
    ``pass: decomposition`` ``groups``, ``alpha``, ``threshold``, ``variant``, ``mode``
    (:class:`rulegraph.passes.decomposition.DecompositionPass`).
    """
    graph, ruleset = prepared(model, rules)
    kind = PASSES.get(ruleset.pass_name)
    options = kind.resolve(options)
    start = forward(graph, ruleset, inputs, target, output=output, position=position, device=device, dtype=dtype,
                    unmatched=kind.unmatched)
    return kind().run(start, audit=audit, **options)
