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


def test_the_ownership_test_counts_every_holder():
    """A tensor is owned when the references its caller counts are all there are, and no other tensor
    shares its memory: another name, a list entry, a view of it, or its being a view all count.
    (Each answer is taken outside ``assert``, whose rewriting holds the arguments.)"""
    owned = lifetimes.sole_owner
    held = {"t": torch.randn(4, 6)}
    alone, miscounted = owned(held["t"], 1), owned(held["t"], 2)      # the dict's entry; one not there
    assert alone and not miscounted
    other = held["t"]
    named = owned(held["t"], 1)
    del other
    args = [held["t"], held["t"]]
    listed = owned(held["t"], 3)                                       # the dict's and the list's two
    del args
    view = held["t"][1:]
    viewed = owned(held["t"], 1)
    del view
    held["v"] = torch.randn(4, 6)[1:]                                 # a view (it holds its base)
    as_view = owned(held["v"], 1)
    assert not named and listed and not viewed and not as_view


def test_each_value_dies_after_its_last_reader():
    reads = [("a", "b"), ("b", "c"), ("c", ""), ("a",)]
    assert lifetimes.deaths(reads, {"c"}) == [(), ("b",), (), ("a",)]        # "c" spared, "" no value
    assert lifetimes.deaths([], set()) == []


def test_the_walker_visits_in_order_and_frees_what_dies(small):
    """The one loop: each step is visited, then the values that die there leave ``env``; the recycler is
    given them while steps remain (after the last no op would take them)."""
    class Log(lifetimes.Walker):
        def visit(self, step, life):
            seen.append((step, sorted(self.env)))

    seen = []
    env = {"a": torch.randn(3), "b": torch.randn(3), "c": torch.randn(3)}
    recycler = lifetimes.Recycler()
    lives = [lifetimes.StepLife(dead, (), ()) for dead in (("a",), (), ("b", "c"))]
    Log(env, recycler).run(["x", "y", "z"], lives)
    assert seen == [("x", ["a", "b", "c"]), ("y", ["b", "c"]), ("z", ["b", "c"])] and env == {}
    assert recycler.given == 1                     # "a"; "b" and "c" died at the last step
    Log(env := {"a": torch.randn(3)}).run(["x"], None)
    assert list(env) == ["a"]                      # no schedule: every value kept


def test_a_tensor_nothing_else_holds_comes_back_on_its_memory_as_a_new_tensor(small):
    r = lifetimes.Recycler()
    t = torch.randn(4, 6)
    address, old = t.data_ptr(), weakref.ref(t)
    held = {"t": t}
    del t
    r.give(held.pop("t"))
    assert r.given == 1 and r.held == 4 * 6 * 4
    got = r.out((3, 8), torch.zeros(3, 8))["out"]
    assert got.data_ptr() == address and got.shape == (3, 8) and got.is_contiguous() and not got._is_view()
    gc.collect()
    assert old() is None         # the tensor it was given is gone: a sum memoized by it is not read again
    assert r.taken == 1 and r.held == 0
    assert r.out((3, 8), torch.zeros(3, 8)) == {}      # nothing left of that size


def test_a_tensor_held_elsewhere_is_not_kept(small):
    r = lifetimes.Recycler()
    t = torch.randn(4, 6)
    r.give(t)                          # the caller's name holds it too
    view = t[1:]
    held = {"t": t}
    del t
    r.give(held.pop("t"))             # a view holds its memory
    assert view.shape == (3, 6)
    base = torch.randn(4, 6)
    r.give(base[:2])                   # a view itself
    r.give(torch.randn(4, 6).mT)       # not contiguous
    r.give(torch.randn(4, 6, requires_grad=True))
    r.give([1, 2])
    r.give(torch.empty(4, 6, device="meta"))      # not on the CPU (a GPU's allocator caches)
    assert r.given == 0


def test_only_a_few_tensors_per_size_and_a_bounded_total_are_kept(small, monkeypatch):
    r = lifetimes.Recycler()
    for _ in range(lifetimes.HELD + 2):
        r.give(torch.randn(5))
    assert r.given == lifetimes.HELD
    monkeypatch.setattr(lifetimes, "HELD_BYTES", r.held + 10)
    r.give(torch.randn(100))
    assert r.given == lifetimes.HELD


def test_an_op_writes_into_a_kept_tensor_only_when_handed_the_recycler(small):
    """No hidden state: the same op allocates as usual without a recycler, and writes into the kept
    tensor when one is handed to it (MatMul's forward, Mul's and Softmax's VJPs)."""
    from rulegraph.ops import REGISTRY, vjp
    r = lifetimes.Recycler()
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    expected = a @ b
    held = {"t": torch.randn(4, 5)}
    kept = held["t"].data_ptr()
    r.give(held.pop("t"))
    matmul = REGISTRY[("", "MatMul")]
    assert matmul.recycles and not REGISTRY[("", "Mul")].recycles and "recycler" not in matmul.defaults
    assert torch.equal(matmul.forward(a, b), expected) and r.taken == 0
    got = matmul.forward(a, b, recycler=r)
    assert r.taken == 1 and got.data_ptr() == kept and torch.equal(got, expected)
    for op, inputs in (("Mul", [torch.randn(4, 5), torch.randn(4, 5)]), ("Softmax", [torch.randn(4, 5)])):
        spec = REGISTRY[("", op)]
        outputs = [spec.forward(*inputs)]
        g = [torch.randn(4, 5)]
        plain = vjp(spec, g, inputs, outputs, [True] * len(inputs), {})
        r.give(torch.randn(4, 5))
        taken = r.taken
        again = vjp(spec, g, inputs, outputs, [True] * len(inputs), {}, r)
        assert spec.vjp_recycles and r.taken == taken + 1 and torch.equal(again[0], plain[0]), op


def test_no_kept_tensor_for_autograd_or_mixed_dtypes(small):
    r = lifetimes.Recycler()
    for _ in range(2):
        r.give(torch.randn(4))
    assert r.out((4,), torch.zeros(4, requires_grad=True)) == {}
    assert r.out((4,), torch.zeros(4), torch.zeros(4, dtype=F64)) == {}
    assert r.out((4,), torch.zeros(4, dtype=torch.int64)) == {}
    assert "out" in r.out((4,), torch.zeros(4))


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
