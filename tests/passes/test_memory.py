"""What the relevance pass keeps in memory: properties, not timings.

The forward keeps only the values a reached node touches, less those the walk computes again where
they are large (``RelevancePass.spills``; ``SPILL_FROM`` bytes): the cheap arithmetic of
``Lifetimes.recomputable`` (an attention's scale, mask, softmax and cast) and the products that outgrow their
inputs (``Lifetimes.spillable``: its scores, once longer than a head is wide). The walk drops each value after
its last reader, so when it ends only what the caller reads afterwards is left (the boundary, the
explained output). Neither changes a number: the relevance and the audit equal, bit for bit, those of a
walk over every forward value. The tiny models' tensors are all small, so the tests of the freeing set
``SPILL_FROM`` to 0 (``spill_all``).
"""
from __future__ import annotations

import pytest
import torch

from rulegraph import RuleSet, interpreter, lifetimes
from rulegraph.boundary import walk as boundary_walk
from rulegraph.interpreter import Stage
from rulegraph.lifetimes import Needs
from rulegraph.passes.base import Pass, forward, prepared
from rulegraph.passes.relevance import RelevancePass, finish, walk

RULE_SETS = ["attnlrp", "gi", "lrp-ah-ln", "cp-lrp"]


@pytest.fixture
def spill_all(monkeypatch):
    """Every value the walk can compute again counts as large."""
    monkeypatch.setattr(lifetimes, "SPILL_FROM", 0)


def _inputs(length: int = 12):
    ids = torch.randint(5, 90, (1, length), generator=torch.Generator().manual_seed(3))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _start(path, rules: str, chosen, dtype=torch.float32, length: int = 12):
    graph, ruleset = prepared(str(path), RuleSet.load(rules))
    return forward(graph, ruleset, _inputs(length), None, output=None, position=None, device="cpu", dtype=dtype,
                   chosen=chosen)


def _forward_values(start) -> set[str]:
    """The values a run computed and kept: neither constants nor those fixed by the input shapes."""
    plan = start.plan
    return {v for v in start.values if v not in plan.constants and plan.stage.get(v) == Stage.VALUE
            and v not in start.graph.input_names}


@pytest.mark.parametrize("rules", RULE_SETS)
def test_forward_keeps_only_what_the_walk_reads(causal_lm, rules, spill_all):
    _, path = causal_lm
    start = _start(path, rules, RelevancePass)
    binding = start.binding
    read = {v for n in binding.reached for v in (*n.inputs, *n.outputs)} | set(binding.boundary) | \
        set(start.graph.outputs) | boundary_walk(start.graph).path_values()     # what maps lookups to positions
    kept = _forward_values(start)
    assert kept <= read
    recomputed = RelevancePass.spills(binding, start.plan) - _products(start)
    assert recomputed, "an attention's scaled scores are cheap arithmetic on kept values"
    assert not kept & recomputed


def _products(start) -> frozenset[str]:
    """The products :meth:`Lifetimes.spillable` names (freed only where they also outgrew their inputs)."""
    binding = start.binding
    return start.plan.lifetimes.spillable(Needs(binding.needed_values, frozenset(n.name for n in binding.reached),
                                                frozenset()))


@pytest.mark.parametrize("rules", ["attnlrp", "gi"])
def test_small_values_are_kept_rather_than_computed_again(causal_lm, rules, monkeypatch):
    """At 40 positions the tiny models' attention tensors (4 heads × 40 × 40 floats) are below
    ``SPILL_FROM``: the forward keeps them and the walk computes nothing again. With the limit between
    their size and the hidden states' (40 × 32), it frees those and keeps the rest."""
    _, path = causal_lm
    calls = []
    recompute = interpreter.Plan.recompute
    monkeypatch.setattr(interpreter.Plan, "recompute", lambda self, env, v, *rest: calls.append(v) or
                        recompute(self, env, v, *rest))
    start = _start(path, rules, RelevancePass, length=40)
    spilled = RelevancePass.spills(start.binding, start.plan)
    assert spilled <= _forward_values(start)
    RelevancePass().run(start, audit=True)
    assert calls == []

    monkeypatch.setattr(lifetimes, "SPILL_FROM", 40 * 40 * 4 * 2)       # above a hidden state, below a head's scores
    start = _start(path, rules, RelevancePass, length=40)
    freed = spilled - _forward_values(start)
    assert freed and all(start.plan.recompute(start.values, v).numel() * 4 >= lifetimes.SPILL_FROM
                         for v in sorted(freed))
    assert all(start.values[v].numel() * 4 < lifetimes.SPILL_FROM for v in spilled - freed)
    RelevancePass().run(start, audit=True)
    assert calls


@pytest.mark.parametrize("rules", RULE_SETS)
def test_walk_leaves_only_what_the_caller_reads(causal_lm, rules):
    _, path = causal_lm
    start = _start(path, rules, RelevancePass)
    RelevancePass().run(start, audit=True)
    left = _forward_values(start)
    assert left <= set(start.binding.boundary) | {start.output}


def _square(start, length: int) -> set[str]:
    """The kept values shaped like attention scores or probabilities (the last two dims: positions)."""
    return {v for v in _forward_values(start) if start.values[v].dim() >= 2
            and tuple(start.values[v].shape[-2:]) == (length, length)}


@pytest.mark.parametrize("rules", ["attnlrp", "gi"])       # those whose relevance goes through the softmax
def test_attention_scores_are_recomputed_once_they_outgrow_queries_and_keys(causal_lm, rules, spill_all):
    """The tiny models' heads are 8 wide: at 12 positions Q·Kᵀ (12 × 12) is smaller than Q and K
    (12 × 8 each) and is kept; at 40 it is larger, the forward frees it and keeps nothing of that shape
    (the scale, mask, softmax and cast after it are recomputed from it; the causal mask, one for all the
    layers, is kept). P·V (positions × 8) never outgrows P and V."""
    _, path = causal_lm
    short = _start(path, rules, RelevancePass, length=12)
    spilled = _products(short)
    assert spilled and spilled <= RelevancePass.spills(short.binding, short.plan)
    assert spilled <= _forward_values(short)
    long = _start(path, rules, RelevancePass, length=40)
    freed = spilled - _forward_values(long)
    assert len(freed) == 2 and all(long.graph.producer[v].op == "MatMul" for v in freed), "each layer's Q·Kᵀ"
    assert len(_square(long, 40)) <= 1, "at most the causal mask the layers share"
    assert all(long.plan.recompute(long.values, v).shape[-2:] == (40, 40) for v in sorted(freed))
    assert len(_square(_start(path, rules, Pass, length=40), 40)) > 4, "a forward for every value keeps them"


@pytest.mark.parametrize("spill_from", [0, None])           # every value the walk can compute again freed; none
@pytest.mark.parametrize("length", [12, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rules", RULE_SETS)
def test_releasing_and_recomputing_change_no_number(causal_lm, rules, dtype, length, spill_from, monkeypatch):
    _, path = causal_lm
    if spill_from is not None:
        monkeypatch.setattr(lifetimes, "SPILL_FROM", spill_from)
    whole = _start(path, rules, Pass, dtype, length)          # every value kept, none released
    full = finish(walk(whole.binding, whole.plan, whole.values, whole.output, whole.seed, audit=True))
    lean = _start(path, rules, RelevancePass, dtype, length)
    assert _forward_values(lean) < _forward_values(whole) if spill_from == 0 else \
        _forward_values(lean) == _forward_values(whole)                 # every value small: none freed
    flow = finish(walk(lean.binding, lean.plan, lean.values, lean.output, lean.seed, audit=True,
                       release=frozenset()))
    assert full.boundary.keys() == flow.boundary.keys()
    for v, r in full.boundary.items():
        assert torch.equal(r, flow.boundary[v])
    figures = lambda f: ([(n.name, *map(f.ledger, (n.entries_in, n.entries_out, n.entries_absorbed, n.entries_mass)))
                          for n in f.nodes], [(e.producer, e.consumer, f.ledger.values[e.entry]) for e in f.edges],
                         f.stranded)
    assert figures(full) == figures(flow)          # every audit figure (the ledger's entries may be shared)
