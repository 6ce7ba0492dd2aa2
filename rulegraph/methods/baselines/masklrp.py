"""``mask-lrp-rollout`` and ``mask-lrp-random``: the final attribution of Mask-LRP (Song et al. 2024, "Better
Explain Transformers by Illuminating Important Information", EACL Findings, Sec. 4.3, Eq. 10–11),
and its random-mask control (Sec. 5.2 and 5.4: a random mask at the same mask rate).

Per attention block ``b``, with the relevance of the ``mask-lrp`` rule set (heads masked to the
positional and syntactic heads, the block renormalised; :mod:`rulegraph.propagation.masked`)::

    Ā^(b) = E_h (∇A^(b) ⊙ (R_synt^(n_b) + R_pos^(n_b)))⁺ + I                                 (Eq. 10)
    R(x)  = Ā^(1) · Ā^(2) · … · Ā^(B)                                                        (Eq. 11)

``∇A^(b)`` is the gradient of the explained logit with respect to the attention probabilities of
block ``b`` (total derivative, through every later block; read as ∇A ⊙ A, the ``gi`` relevance pass's
relevance at A, as for ``gae``), and
``R^(n_b)`` the relevance of the attention map: the AH share of each edge ``q → k`` of the masked
head relevance ``R'`` at the value product ``O = A V``, ``R_A[h, q, k] = Σ_d A_qk V_kd R'_qd / O_qd``
(its sum over ``k`` and ``d`` is ``R'``). As in the paper's numbering the block nearest the output
is ``b = 1``, so the product runs from the last block to the first (Chefer et al. 2021, CVPR, Eq. 13–14);
the scores are the row of the explained position (``row``: 0 = [CLS]).
"""
from __future__ import annotations

import json
import random

import torch

from ...errors import InputError
from ...explanation import Explanation
from ...heads import HeadMasks, find_heads, read_masks
from ...interpreter import Plan
from ...lifetimes import Recycler
from ...passes.base import ALL, Pass, forward, pass_of
from ...passes.relevance import walk
from ...propagation.masked import masked
from ...propagation.numerics import divide
from ...ruleset import Binding, RuleSet, shipped_rule_sets
from ..base import Option, Request, baseline
from ..sequences import token_input
from .attention import one_sequence, query_rows
from .common import explanation

Tensor = torch.Tensor
_RULES: dict[str, RuleSet] = {}


def rule_set(masks: HeadMasks | None) -> RuleSet:
    """The shipped ``mask-lrp`` rule set with ``masks`` inline (``None``: every head kept)."""
    inline = json.dumps({str(b): list(t) for b, t in sorted(masks.types.items())}) if masks else None
    key = inline or ""
    if key not in _RULES:
        text = shipped_rule_sets()["mask-lrp"].read_text(encoding="utf-8")
        old = 'params: {masks: ""}'
        if old not in text:
            raise InputError("rules/mask-lrp.yaml no longer has `params: {masks: \"\"}` on its head-mask entry")
        _RULES[key] = RuleSet.from_yaml(text.replace(old, f"params: {{inline: {inline}}}") if inline else text,
                                        source="rules/mask-lrp.yaml")
    return _RULES[key]


def random_masks(masks: HeadMasks, blocks, seed: int) -> HeadMasks:
    """The head types of ``masks`` shuffled over every head of the model (seeded): the same number of
    positional, syntactic and none heads, so the same mask rate ‖M_random‖ = ‖M‖."""
    slots = [(b.block, m) for b in blocks for m in range(b.heads)]
    types = [t for b in blocks for t in (masks.of(b.block, b.heads) or ("positional",) * b.heads)]
    random.Random(seed).shuffle(types)
    out: dict[int, list[str]] = {b.block: [] for b in blocks}
    for (block, _), t in zip(slots, types):
        out[block].append(t)
    return HeadMasks({b: tuple(t) for b, t in out.items()}, f"random({masks.source}, seed={seed})")


def _keeping(extra: frozenset[str]) -> type[Pass]:
    """A prologue keeping, besides every value its rule set's walk reads, the values ``extra`` (none spilled)."""
    class Keeping(Pass):
        @classmethod
        def keeps(cls, binding: Binding, plan: Plan) -> frozenset[str]:
            return binding.needed_values | extra
    return Keeping


def mask_lrp(req: Request, masks: HeadMasks | None, row: int) -> Explanation:
    """The rollout of Eq. 10–11 from one forward, the prologue (:func:`rulegraph.passes.base.forward`) on the
    request's graph, and two walks over its values: the ``gi`` pass's, whose relevance at the attention map A
    fed to block b's value product is ∇A ⊙ A with ∇A the total derivative (as for ``gae``; through a quantized
    graph's rounding as the straight-through gradient, the rounding held constant), then the ``mask-lrp``
    pass's, the masked head relevance R' at the product. ∇A ⊙ R_A = (∇A ⊙ A) ⊙ Σ_d V_kd R'_qd / O_qd."""
    blocks = find_heads(req.graph)
    if not blocks:
        raise InputError("mask-lrp needs attention blocks (a Softmax feeding the value product); none found")
    rules = rule_set(masks)
    binding, gi = req.bind(rules), req.bind(RuleSet.load("gi"))
    nodes = [req.graph.node(b.product) for b in blocks]
    maps = frozenset(n.inputs[0] for n in nodes)
    recycler = Recycler()       # large tensors the forward and the walks drop, written into again
    start = forward(req.graph, rules, req.inputs, req.target, output=req.output, position=req.position,
                    device=req.device, dtype=req.dtype, score=req.score, chosen=_keeping(gi.needed_values),
                    recycler=recycler, logits=ALL)      # the rollout reads the query rows of its own forward's output
    held = {v: start.values[v] for n in nodes for v in (n.inputs[1], n.outputs[0])}
    with torch.no_grad():
        weighted = walk(gi, start.plan, start.values, start.output, start.seed, audit=False, record_at=maps,
                        recycler=recycler).recorded
    one_sequence([weighted[n.inputs[0]] for n in nodes if n.inputs[0] in weighted], "mask-lrp-rollout")
    e = pass_of(rules)().run(start, audit=req.audit, record=[n.outputs[0] for n in nodes])
    rollout = None
    for b, node in zip(blocks, nodes):
        if node.outputs[0] not in e.recorded:
            raise InputError(f"no relevance reached the value product {b.product!r} of block {b.block}")
        v, o = held[node.inputs[1]], held[node.outputs[0]]
        if node.inputs[0] not in weighted:
            raise InputError(f"no gradient reached the attention map {node.inputs[0]!r} of block {b.block}")
        grad_a = weighted[node.inputs[0]]                                                # ∇A ⊙ A
        rule = binding.assignments[node.name].rule                                       # the head mask
        kept = masked(e.recorded[node.outputs[0]].to(o), rule.types(node, b.heads))     # R', masked
        s = divide(kept, o)                                                             # R' / O
        cam = (grad_a * torch.einsum("bhkd,bhqd->bhqk", v, s)).mean(1).clamp(min=0)     # Eq. 10 (heads averaged, ⁺)
        cam = cam + torch.eye(cam.shape[-1], dtype=cam.dtype, device=cam.device)
        rollout = cam if rollout is None else cam @ rollout                              # Eq. 11
    rows = query_rows(req, row, rollout.shape[0], rollout.shape[1], e.position)
    scores = torch.stack([rollout[i, q] for i, q in enumerate(rows)]).detach().double().cpu()
    out = torch.as_tensor(e.output_tensor)
    return explanation(req, out, e.target, e.position, {token_input(req.graph): scores},
                       masks=masks.source if masks else None,
                       mask_rate=masks.rate if masks else 1.0)


def _masks(path: str) -> HeadMasks | None:
    return read_masks(path) if path else None


@baseline("mask-lrp-rollout", "Mask-LRP (Song et al. 2024, Eq. 10–11): head-averaged positive ∇A ⊙ R of the attention maps "
          "(relevance of the mask-lrp rule set, heads masked to the positional/syntactic ones of --masks) plus "
          "identity, rolled out over the blocks; the row of the explained position",
          Option("masks", str, "", "mask file of `rulegraph heads calibrate` (empty: every head kept)"),
          Option("row", int, 0, "query position read: 0 = [CLS]; negative counts back from the last real token"),
          unit="rolled-out attention relevance", rules="mask-lrp")
def mask_lrp_method(req: Request, masks: str, row: int) -> Explanation:
    return mask_lrp(req, _masks(masks), row)


@baseline("mask-lrp-random", "Mask-LRP with a random head mask at the same mask rate (Song et al. 2024, Sec. 5.4 "
          "ablation): the head types of --masks shuffled over the model's heads (seeded)",
          Option("masks", str, "", "mask file whose mask rate (and type counts) the random mask keeps"),
          Option("seed", int, 0, "seed of the shuffle"),
          Option("row", int, 0, "query position read, as for mask-lrp-rollout"),
          unit="rolled-out attention relevance", rules="mask-lrp")
def mask_lrp_random(req: Request, masks: str, seed: int, row: int) -> Explanation:
    if not masks:
        raise InputError("mask-lrp-random needs -o mask-lrp-random.masks=FILE (its mask rate is kept)")
    return mask_lrp(req, random_masks(read_masks(masks), find_heads(req.graph), seed), row)
