"""Replayed explanations (``replay=True``, rulegraph.passes.replay): the traced forward and walk give the
explanation the interpreter gives — the relevance bit for bit (the same ATen ops in the same order), the
audit's figures to 1e-12 relative in float64 (its sums are taken as tensors, one per edge) — for the first
input of a shape (traced), for another input of that shape (replayed) and for another shape (traced again);
what it does not replay is refused before any work."""
from __future__ import annotations

import pytest
import torch

import rulegraph
import tiny
from rulegraph.canonize.rows import pooled
from rulegraph.errors import InputError
from rulegraph.lifetimes import WalkCache
from rulegraph.passes import pass_of, replay as replay_module
from targets import same

F64 = torch.float64
RELEVANCE_SETS = [name for name in sorted(rulegraph.shipped_rule_sets())
                  if pass_of(rulegraph.RuleSet.load(name)).name == "relevance"]


@pytest.mark.parametrize("rules", RELEVANCE_SETS)
def test_a_replayed_explanation_equals_the_interpreters(bert_onnx, rules):
    for feeds in (tiny.token_inputs(batch=2, length=9, pad=3, seed=1),      # traced
                  tiny.token_inputs(batch=2, length=9, pad=2, seed=2)):     # replayed: another input, its shape
        eager = rulegraph.explain(bert_onnx, rules, feeds, dtype=F64)
        replayed = rulegraph.explain(bert_onnx, rules, feeds, dtype=F64, replay=True)
        for key in eager.boundary:
            assert torch.equal(replayed.boundary[key], eager.boundary[key]), key
            assert torch.equal(replayed.relevance[key], eager.relevance[key]), key
        same(replayed, eager, rounding=1e-12)
        assert replayed.audit.conservation.relative_error <= 1e-10


def test_the_second_input_of_a_shape_is_replayed_not_traced(bert_onnx, monkeypatch):
    traced = []
    real = replay_module._trace
    monkeypatch.setattr(replay_module, "_trace", lambda f, args, what: traced.append(what) or real(f, args, what))
    graph = rulegraph.load(bert_onnx)
    for seed in (1, 2, 3):
        rulegraph.explain(graph, "attnlrp", tiny.token_inputs(length=7, seed=seed), replay=True)
    assert traced == ["the forward", "the relevance walk"]
    feeds = tiny.token_inputs(length=8)             # another shape: traced again, and equal to the interpreter
    replayed = rulegraph.explain(graph, "attnlrp", feeds, dtype=F64, replay=True)
    assert traced[2:] == ["the forward", "the relevance walk"]
    same(replayed, rulegraph.explain(graph, "attnlrp", feeds, dtype=F64), rounding=1e-12)


def test_the_traces_kept_are_bounded(bert_onnx, monkeypatch):
    monkeypatch.setattr(replay_module, "KEPT", 1)
    graph = rulegraph.load(bert_onnx)
    for length in (4, 5, 6):
        rulegraph.explain(graph, "lrp-ah-ln", tiny.token_inputs(length=length), replay=True)
    ruleset = rulegraph.RuleSet.load("lrp-ah-ln")
    explained = [g for g in (graph, pooled(graph)) if g is not None]      # (the classifier's last layers pooled)
    caches = [c for g in explained for c in ruleset.bind(g).walks.values() if isinstance(c, WalkCache)]
    assert caches and all(len(c.replays) <= replay_module.KEPT for c in caches)


def test_a_language_model_is_replayed_at_its_explained_position(causal_lm):
    _, path = causal_lm
    for seed in (4, 5):             # traced, then replayed (the narrowed head: position 3's row only)
        ids = tiny.token_inputs(("input_ids", "attention_mask"), length=7, seed=seed)
        eager = rulegraph.explain(path, "attnlrp", ids, dtype=F64, position=3)
        replayed = rulegraph.explain(path, "attnlrp", ids, dtype=F64, position=3, replay=True)
        assert torch.equal(replayed.relevance["input_ids"], eager.relevance["input_ids"])
        same(replayed, eager, rounding=1e-12)


@pytest.mark.parametrize("asked, says", [
    (dict(method="decomposition"), "the decomposition pass is not replayed"),
    (dict(targets="all"), "targets=… is not replayed"),
    (dict(record=["input_ids"]), "record is not replayed"),
    (dict(at="op Softmax"), "at is not replayed"),
    (dict(replay="maybe"), "option attnlrp.replay must be"),
    (dict(compiled=True, device="cuda"), "compiled: replays on cuda are captured as CUDA graphs, not compiled"),
])
def test_what_is_not_replayed_is_refused_before_any_work(bert_onnx, asked, says, monkeypatch):
    def traced(*_):
        raise AssertionError("a forward ran before the refusal")
    monkeypatch.setattr(replay_module, "_trace", traced)
    options = {"method": "attnlrp", "replay": True, **asked}
    with pytest.raises(InputError, match=says.replace("(", r"\(").replace(")", r"\)")):
        rulegraph.explain(bert_onnx, inputs=tiny.token_inputs(length=7), **options)


def test_a_walk_that_reads_data_is_refused_not_baked_in(bert_onnx, monkeypatch):
    """A trace that would bake a decision taken on one input's values into every replay is refused."""
    from rulegraph.propagation.gradient import Gradient
    real = Gradient.propagate

    def deciding(self, site):
        if bool(site.incoming[0].value.sum() > 0):     # a decision on the data
            pass
        return real(self, site)

    monkeypatch.setattr(Gradient, "propagate", deciding)
    with pytest.raises(InputError, match="cannot be traced for replay .* explain without replay"):
        rulegraph.explain(bert_onnx, "gi", tiny.token_inputs(length=5), replay=True)


@pytest.mark.parametrize("family", ["dinov2", "bart-cls"])
def test_an_image_model_replays_and_a_shape_the_data_decides_is_refused(family, tmp_path):
    """Pixels (a float input, checked before the trace) replay like token ids; BART's classifier finds its eos
    positions with NonZero, a shape its data decides, and is refused at the trace, naming why."""
    import architectures
    chosen = architectures.BY_NAME[family]
    _, path = architectures.export(chosen, tmp_path)
    feeds = architectures.feeds(chosen, path)
    if family == "bart-cls":
        with pytest.raises(InputError, match="the forward cannot be traced for replay .*data-dependent"):
            rulegraph.explain(path, "attnlrp", feeds, replay=True)
        return
    eager = rulegraph.explain(path, "attnlrp", feeds, dtype=F64)
    for _ in range(2):
        same(rulegraph.explain(path, "attnlrp", feeds, dtype=F64, replay=True), eager, rounding=1e-12)


def test_a_compiled_replay_equals_the_interpreter_and_compiles_once_per_shape(bert_onnx, monkeypatch):
    """``compiled=True``: the traces compiled by TorchInductor (C++ kernels) on the CPU, once per input shape;
    its sums taken in other orders, every figure equal to the interpreter's within rounding (float64)."""
    compiles = []
    real = replay_module._compiled
    monkeypatch.setattr(replay_module, "_compiled", lambda graph, args: compiles.append(1) or real(graph, args))
    graph = rulegraph.load(bert_onnx)
    for seed in (1, 2):                             # compiled, then replayed from the compiled traces
        feeds = tiny.token_inputs(batch=2, length=7, pad=2, seed=seed)
        compiled = rulegraph.explain(graph, "attnlrp", feeds, dtype=F64, compiled=True)
        eager = rulegraph.explain(graph, "attnlrp", feeds, dtype=F64)
        for key in eager.relevance:
            torch.testing.assert_close(compiled.relevance[key], eager.relevance[key], rtol=1e-12, atol=1e-14)
        same(compiled, eager, rounding=1e-12)
    assert len(compiles) == 2                       # the forward and the walk, once
    with pytest.raises(InputError, match="targets=… is not replayed"):
        rulegraph.explain(graph, "attnlrp", tiny.token_inputs(length=7), targets="all", compiled=True)


def test_a_compiled_walk_back_through_gathers_stays_in_bounds(tmp_path):
    """A Bloom's walk takes each head's query, key and value back through a Gather of its fused projection
    from a transposed view; TorchInductor's own scatter code for it wrote past its buffer (the heap corrupted,
    the process aborted) and adds in an order that varies with the threads. Compiled, the walk leaves scatters
    to ATen's kernels (torch's deterministic mode, the caller's setting restored): equal to the interpreter,
    the same bytes at every call."""
    import architectures
    chosen = architectures.BY_NAME["bloom"]
    _, path = architectures.export(chosen, tmp_path)
    feeds = architectures.feeds(chosen, path)
    graph = rulegraph.load(path)
    eager = rulegraph.explain(graph, "attnlrp", feeds, dtype=F64)
    assert not torch.are_deterministic_algorithms_enabled()
    first = rulegraph.explain(graph, "attnlrp", feeds, dtype=F64, compiled=True)
    again = rulegraph.explain(graph, "attnlrp", feeds, dtype=F64, compiled=True)
    assert not torch.are_deterministic_algorithms_enabled()
    same(first, eager, rounding=1e-12)
    for key in eager.relevance:
        assert torch.equal(first.boundary[key], again.boundary[key])


def test_a_model_given_by_its_path_is_warned_of(bert_onnx, recwarn):
    """Replays are kept with the loaded graph: a path loads anew at every call, which a warning says; a loaded
    graph replays without one."""
    feeds = tiny.token_inputs(length=6)
    with pytest.warns(UserWarning, match=r"replay: the model given by its path .* load it once"):
        rulegraph.explain(str(bert_onnx), "attnlrp", feeds, replay=True)
    recwarn.clear()
    graph = rulegraph.load(bert_onnx)
    rulegraph.explain(graph, "attnlrp", feeds, replay=True)
    rulegraph.explain(str(bert_onnx), "attnlrp", feeds)
    assert not [w for w in recwarn if "replay:" in str(w.message)]
