"""Value lifetimes (rulegraph.lifetimes). Recycling large tensors within an explanation: only a tensor nothing else
holds is kept, it comes back as a new tensor on the same memory, and an explanation that recycles every
tensor it can has the same bits as one that recycles none."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import rulegraph
import tiny
from rulegraph import lifetimes

F64 = torch.float64


@pytest.fixture
def small(monkeypatch):
    """Every tensor counts as large."""
    monkeypatch.setattr(lifetimes, "RECYCLE_FROM", 1)


def test_a_tensor_nothing_else_holds_comes_back_on_its_memory_as_a_new_tensor(small):
    with lifetimes.recycling() as r:
        t = torch.randn(4, 6)
        address, old = t.data_ptr(), weakref.ref(t)
        held = {"t": t}
        del t
        lifetimes.give(held.pop("t"))
        assert r.given == 1 and r.held == 4 * 6 * 4
        got = lifetimes.out((3, 8), torch.zeros(3, 8))["out"]
        assert got.data_ptr() == address and got.shape == (3, 8) and got.is_contiguous() and not got._is_view()
        gc.collect()
        assert old() is None         # the tensor it was given is gone: a sum memoized by it is not read again
        assert r.taken == 1 and r.held == 0
        assert lifetimes.out((3, 8), torch.zeros(3, 8)) == {}      # nothing left of that size


def test_a_tensor_held_elsewhere_is_not_kept(small):
    with lifetimes.recycling() as r:
        t = torch.randn(4, 6)
        lifetimes.give(t)                          # the caller's name holds it too
        view = t[1:]
        held = {"t": t}
        del t
        lifetimes.give(held.pop("t"))             # a view holds its memory
        assert view.shape == (3, 6)
        base = torch.randn(4, 6)
        lifetimes.give(base[:2])                   # a view itself
        lifetimes.give(torch.randn(4, 6).mT)       # not contiguous
        lifetimes.give(torch.randn(4, 6, requires_grad=True))
        lifetimes.give([1, 2])
        lifetimes.give(torch.empty(4, 6, device="meta"))      # not on the CPU (a GPU's allocator caches)
        assert r.given == 0


def test_only_a_few_tensors_per_size_and_a_bounded_total_are_kept(small, monkeypatch):
    with lifetimes.recycling() as r:
        for _ in range(lifetimes.HELD + 2):
            lifetimes.give(torch.randn(5))
        assert r.given == lifetimes.HELD
        monkeypatch.setattr(lifetimes, "HELD_BYTES", r.held + 10)
        lifetimes.give(torch.randn(100))
        assert r.given == lifetimes.HELD


def test_outside_an_explanation_nothing_is_kept(small):
    lifetimes.give(torch.randn(4))
    assert lifetimes.out((4,), torch.zeros(4)) == {}
    with lifetimes.recycling() as outer, lifetimes.recycling() as inner:
        assert inner is outer


def test_no_kept_tensor_for_autograd_or_mixed_dtypes(small):
    with lifetimes.recycling():
        for _ in range(2):
            lifetimes.give(torch.randn(4))
        assert lifetimes.out((4,), torch.zeros(4, requires_grad=True)) == {}
        assert lifetimes.out((4,), torch.zeros(4), torch.zeros(4, dtype=F64)) == {}
        assert lifetimes.out((4,), torch.zeros(4, dtype=torch.int64)) == {}
        assert "out" in lifetimes.out((4,), torch.zeros(4))


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def language_model(request, tmp_path_factory):
    return tiny.onnx(tiny.causal_lm(request.param), tmp_path_factory.mktemp(request.param) / "model.onnx",
                     names=("input_ids", "attention_mask"))


def _same_bits_recycled(monkeypatch, graph, rules, feeds, **kw):
    """The explanation's relevance (or components' scores) and audit, keeping no tensor and keeping every
    one it can; and whether it kept some (so the comparison can fail)."""
    def run():
        e = rulegraph.explain(graph, rules, feeds, **kw)
        a = e.audit
        return [*(r for _, r in sorted(e.relevance.items())), torch.tensor(
            [x for n in a.nodes for x in (n.relevance_in, n.relevance_out, n.absorbed, n.breaks)], dtype=F64)]

    monkeypatch.setattr(lifetimes, "RECYCLE_FROM", 1 << 62)
    plain = run()
    monkeypatch.setattr(lifetimes, "RECYCLE_FROM", 1)
    made = []
    init = lifetimes.Recycler.__init__
    monkeypatch.setattr(lifetimes.Recycler, "__init__", lambda self: (init(self), made.append(self))[0])
    recycled = run()
    assert made and made[0].taken > 0
    assert all(torch.equal(p, r) for p, r in zip(plain, recycled, strict=True))


@pytest.mark.parametrize("spill_from", [0, None])      # the walk computes the attention again, or finds it held
@pytest.mark.parametrize("rules", ["attnlrp", "cp-lrp", "gi"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_recycling_every_tensor_changes_no_bit(language_model, rules, dtype, spill_from, monkeypatch):
    """The same kernels write into kept tensors: relevance and every audit figure are byte-identical to an
    explanation that keeps none; and it did keep some (the test can fail). With ``SPILL_FROM`` at 0 the
    values the walk computes again are written into kept tensors too."""
    if spill_from is not None:
        monkeypatch.setattr(lifetimes, "SPILL_FROM", spill_from)
    feeds = tiny.token_inputs(("input_ids", "attention_mask"), length=12)
    _same_bits_recycled(monkeypatch, rulegraph.load(language_model), rules, feeds, dtype=dtype)


@pytest.fixture(scope="module", params=["convbert", "bloom", "t5-cls"])
def family(request, tmp_path_factory):
    import architectures
    family = architectures.BY_NAME[request.param]
    _, path = architectures.export(family, tmp_path_factory.mktemp(request.param))
    return path, architectures.feeds(family, path)


@pytest.mark.parametrize("rules,options", [("gi", {}), ("decomposition", {"mode": "components", "alpha": "signed"}),
                                           ("decomposition", {"mode": "linearized", "alpha": "signed"})])
def test_recycling_changes_no_bit_in_other_families(family, rules, options, monkeypatch):
    """Convolutions, ALiBi, relative positions; the decomposition's components (some ops run under vmap,
    which takes no ``out=``) and its linearized pass (autograd)."""
    path, feeds = family
    _same_bits_recycled(monkeypatch, rulegraph.load(path), rules, feeds, dtype=F64, **options)
