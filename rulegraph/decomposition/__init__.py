"""Linear decomposition as a forward rule pass (seeds/000: Yang et al. 2023, Sec. 2).

Every value that depends on the input carries G+1 components — one per group of an
input partition, plus the bias component B — and Σ components equals the value at
every node. Rule files with ``pass: decomposition`` (``rules/decomposition.yaml``)
assign the rules of :mod:`.rules` to nodes; :func:`decompose` runs the pass and
returns an :class:`~rulegraph.explain.Explanation` whose scores are each group's
contribution to the explained output; :func:`run_pass` gives every component.
"""
from .engine import DecompositionAudit, LayerReconstruction, Pass, decompose, run_pass
from .partition import Partition, assign
from .rules import DECOMPOSITION_RULES, DecompositionRule, Parts, Site, decomposition_rule

__all__ = ["DECOMPOSITION_RULES", "DecompositionAudit", "DecompositionRule", "LayerReconstruction", "Partition",
           "Parts", "Pass", "Site", "assign", "decompose", "decomposition_rule", "run_pass"]
