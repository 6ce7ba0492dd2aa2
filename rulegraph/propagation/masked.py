"""Mask-LRP's head mask (Song et al. 2024, "Better Explain Transformers by Illuminating Important
Information", EACL Findings, Sec. 4.3).

The relevance of the heads of attention block ``b`` is masked by ``M^(b)`` — the heads found
positional or syntactic (Sec. 4.2, Eq. 6–8; ``rulegraph heads calibrate``) are kept, the rest
dropped — and the kept relevance renormalised so the block conserves::

    R^(n_b) := R_synt + R_pos = G(X, Y, M^(b) R^(n_b − 1))                        (Sec. 4.3, after Eq. 9)
    R_synt  := R_synt · |ΣR_synt| / (|ΣR_synt| + |ΣR_pos|) · ΣR^(n_b − 1) / ΣR_synt
    R_pos   := R_pos  · |ΣR_pos|  / (|ΣR_synt| + |ΣR_pos|) · ΣR^(n_b − 1) / ΣR_pos

Choices, stated:

* The paper writes the first factor's denominator as ``|ΣR^(n_b)|`` with ``R^(n_b) = R_synt + R_pos``;
  that conserves only when ΣR_synt and ΣR_pos have the same sign. We use ``|ΣR_synt| + |ΣR_pos|``
  (the form of the residual-sum rule of Chefer et al. 2021, CVPR, which Mask-LRP builds on): equal
  to the paper's where both have the same sign, and the block conserves always.
* ``M`` is binary: a head is kept when its type is ``positional`` or ``syntactic`` (Eq. 6 adds
  two indicator sums; a head with both types is listed once, as ``syntactic``).
* Sums run per batch item over the block's heads, queries and head dimensions.
* A block whose kept heads carry no relevance (every head ``none``, or kept sums all zero) is
  left unmasked, so that it still conserves (a mask of ones degenerates to the base LRP,
  Song et al. 2024, Sec. 5.4).

The rule applies to the probabilities × values product (like ``ah``, whose relevance it then
hands on to the values); the block number is the node's ``block i`` from its scope or name
(:meth:`Graph.block_of`), as ``rulegraph heads calibrate`` keys the masks it writes; a graph whose
attention blocks are not told apart by such numbers is refused by both (:func:`rulegraph.heads.unkeyed`).
"""
from __future__ import annotations

import re
from typing import Any, ClassVar

import torch

from ..errors import RuleMatchError, RulegraphError
from ..ir import block_of
from .base import relevance_rule, param
from .gradient import AttentionHead, _gradient_contributions
from .numerics import divide

Tensor = torch.Tensor

def renormalise(r: Tensor, types: tuple[str, ...]) -> Tensor:
    """The per-(item, head) factor of the masked, renormalised relevance (module doc); ``r`` is
    ``[batch, heads, …]``. Items whose kept heads carry no relevance get factor 1 (unmasked)."""
    b, h = r.shape[:2]
    sums = r.reshape(b, h, -1).sum(-1)                                         # ΣR per head
    total = sums.sum(1)                                                        # ΣR^(n_b − 1)
    factor = torch.zeros_like(sums)
    groups = [[m for m, t in enumerate(types) if t == kind] for kind in ("syntactic", "positional")]
    group_sums = [sums[:, g].sum(1) if g else torch.zeros_like(total) for g in groups]
    denominator = sum(s.abs() for s in group_sums)
    for g, s in zip(groups, group_sums):
        if g:
            factor[:, g] = (divide(s.abs(), denominator) * divide(total, s)).unsqueeze(1)
    degenerate = (denominator == 0) & (total != 0)
    return torch.where(degenerate.unsqueeze(1), torch.ones_like(factor), factor)


def masked(r: Tensor, types: tuple[str, ...] | None) -> Tensor:
    """The relevance ``r`` (``[batch, heads, …]``) at a block's value product, masked and renormalised
    (``types``: one per head; ``None``: every head kept)."""
    if types is None:
        return r
    factor = renormalise(r, types)
    return r * factor.reshape(*factor.shape, *([1] * (r.dim() - 2)))


@relevance_rule("head-mask")
class HeadMask(AttentionHead):
    """Mask-LRP head mask on the AH rule (Song et al. 2024, Sec. 4.3; module doc). ``masks``: a mask
    file (YAML/JSON, ``rulegraph heads calibrate`` writes one; relative to the working directory);
    ``inline``: the same ``{block: [positional|syntactic|none, …]}`` in the rule file. With
    neither, every head is kept (the base rule)."""

    masks: str = param("")
    inline: Any = param(None)
    breaking: ClassVar[str] = "conserves (heads masked, the block's total renormalised)"

    def __post_init__(self):
        from ..heads import inline_masks, read_masks
        if self.masks and self.inline is not None:
            raise ValueError("give `masks` (a file) or `inline`, not both")
        try:
            self._masks = read_masks(self.masks) if self.masks else (
                inline_masks(self.inline) if self.inline is not None else None)
        except RulegraphError as exc:     # the rule-file parser reports it at the params' line
            raise ValueError(re.sub(r"^<inline>:\d+: ", "inline masks: ", str(exc))) from None

    def check_graph(self, graph, node) -> str | None:
        """A mask is keyed by block number: refused, as ``rulegraph heads calibrate`` refuses, where the graph
        does not tell its attention blocks apart by number (:func:`rulegraph.heads.unkeyed`)."""
        from ..heads import unkeyed
        return None if self._masks is None else unkeyed(graph, node)

    def propagate(self, site):
        carried = self.carries(site.node, site.spec, site.tainted)
        out = site.outputs[0]
        types = self._types(site.node, out)
        if types is None:
            return _gradient_contributions(site, carried, [site.ratio(0)])
        kept = masked(site.incoming[0].tensor, types)
        return _gradient_contributions(site, carried, [divide(kept, out)])

    def types(self, node, heads: int) -> tuple[str, ...] | None:
        """The head types of ``node``'s block (``None``: every head kept)."""
        if self._masks is None:
            return None
        block = block_of(node)
        if block is None:
            raise RuleMatchError(f"head-mask at {node.name!r}: no block number in its scope or name")
        return self._masks.of(block, heads)

    def _types(self, node, out: Tensor) -> tuple[str, ...] | None:
        if self._masks is None:
            return None
        if out.dim() != 4:
            raise RuleMatchError(f"head-mask at {node.name!r}: the product is {tuple(out.shape)}, "
                                 "expected [batch, heads, query, d_head]")
        return self.types(node, out.shape[1])
