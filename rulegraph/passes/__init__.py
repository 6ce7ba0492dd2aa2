"""Passes: what runs after the forward to explain the output, chosen by a rule file's ``pass:``.

Every pass starts from the same prologue (:func:`~rulegraph.passes.base.forward`) and walks
the nodes the rule set reaches with its own rules:

``relevance``      (default) backward from the explained output to the boundary, LRP-style
                   (:mod:`.relevance`), audited for conservation at every node and layer;
``decomposition``  forward, every value carrying one component per input group plus a bias
                   component (:mod:`.decomposition`), audited for Σ components = value.

:func:`apply` runs a rule set on model inputs: the pass its ``pass:`` names, with that pass's
options (:data:`rulegraph.options.PASS_OPTIONS`). Adding a pass is one module registering a
:class:`~rulegraph.passes.base.Pass` subclass in :data:`PASSES`, its options, and a rule registry
of the same name in :data:`rulegraph.propagation.RULES`.
"""
from . import decomposition, relevance  # noqa: F401  (register on import)
from .base import PASSES, Forward, Pass, admit, apply, apply_targets, forward, pass_of, prepared

__all__ = ["PASSES", "Forward", "Pass", "admit", "apply", "apply_targets", "forward", "pass_of", "prepared"]
