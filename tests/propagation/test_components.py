"""The decomposition rules' shared pieces: the group sums taken once, and the chunked elementwise rules."""
from __future__ import annotations

import gc

import pytest
import torch

from rulegraph.ir import Node
from rulegraph.ops import lookup
from rulegraph.propagation import RULES
from rulegraph.propagation.components import ComponentSite, GroupSums, Parts


def test_a_group_sum_is_taken_once_per_tensor_and_anew_for_another_layout():
    sums = GroupSums()
    groups = torch.randn(5, 3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    first = sums(groups)
    assert torch.equal(first, groups.sum(0))
    assert sums(groups) is first                     # the same memory and layout: the earlier sum
    view = groups.transpose(1, 2)                    # the same memory read in another order
    assert sums(view) is not first
    assert torch.equal(sums(view), view.sum(0))


def test_a_group_sum_is_dropped_with_its_tensor():
    sums = GroupSums()
    sums(torch.ones(5, 3, 4))
    gc.collect()
    assert not sums._taken                            # freed memory, if reused, is summed anew
    for value in (1.0, 2.0):                          # a tensor made where the last one was freed
        assert torch.equal(sums(torch.full((5, 3, 4), value)), torch.full((3, 4), 5 * value))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("options", [dict(alpha="signed"), dict(alpha="hybrid"), dict(alpha="abs"),
                                     dict(variant="bar")])
def test_chunked_activation_has_the_bits_of_the_whole(dtype, options):
    """The rule's elementwise work done a few groups at a time, each chunk written into the output,
    equals doing it on all the groups at once, bit for bit (Σ|D_g| of abs and hybrid α is summed chunk
    by chunk in both: it is the one sum the chunk size orders)."""
    g = torch.Generator().manual_seed(3)
    groups = torch.randn(7, 2, 6, generator=g, dtype=dtype)
    bias = torch.randn(2, 6, generator=g, dtype=dtype)
    h = groups.sum(0) + bias
    spec = lookup("Relu")
    node = Node("relu", "Relu", ("h",), ("y",), {})
    rule = RULES["decomposition"].get("activation")(**options)

    def run(chunk):
        site = ComponentSite(node, spec, {}, [h], [torch.relu(h)], [Parts(groups, bias)], chunk=chunk)
        return rule.decompose(site)[0]
    whole, chunked = run(7), run(2)
    if options.get("alpha") in ("signed", None):
        assert torch.equal(chunked.groups, whole.groups) and torch.equal(chunked.bias, whole.bias)
    torch.testing.assert_close(chunked.total(), torch.relu(h))


@pytest.mark.parametrize("op", ["LayerNormalization", "RMSNormalization"])
def test_chunked_layernorm_has_the_bits_of_the_whole(op):
    g = torch.Generator().manual_seed(4)
    groups = torch.randn(5, 3, 8, generator=g, dtype=torch.float64)
    bias = torch.randn(3, 8, generator=g, dtype=torch.float64)
    x = groups.sum(0) + bias
    gamma, beta = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    spec = lookup(op)
    attrs = {**spec.defaults, "axis": -1, "epsilon": 1e-5}
    inputs = [x, gamma, beta] if op == "LayerNormalization" else [x, gamma]
    y = spec.forward(*inputs, **attrs)
    y = y[0] if isinstance(y, (tuple, list)) else y
    node = Node("norm", op, tuple("xgb"[:len(inputs)]), ("y",), attrs)
    rule = RULES["decomposition"].get("layernorm")()

    def run(chunk):
        parts = [Parts(groups, bias)] + [None] * (len(inputs) - 1)
        return rule.decompose(ComponentSite(node, spec, attrs, inputs, [y], parts, chunk=chunk))[0]
    whole, chunked = run(5), run(2)
    assert torch.equal(chunked.groups, whole.groups) and torch.equal(chunked.bias, whole.bias)
    torch.testing.assert_close(whole.total(), y, rtol=1e-12, atol=1e-12)


def test_an_owned_input_takes_the_output_and_its_sum_is_forgotten():
    """Where the pass says the rule may (``owned``), the activation writes into its input's groups: the
    same bits as a new tensor, and the input's Σ_g, read before, is not handed out for the new values."""
    g = torch.Generator().manual_seed(5)
    groups = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    bias = torch.randn(3, 5, generator=g, dtype=torch.float64)
    h = groups.sum(0) + bias
    node, spec = Node("relu", "Relu", ("h",), ("y",), {}), lookup("Relu")
    rule = RULES["decomposition"].get("activation")(alpha="signed")
    fresh = rule.decompose(ComponentSite(node, spec, {}, [h], [torch.relu(h)], [Parts(groups.clone(), bias)], chunk=4))[0]
    sums = GroupSums()
    site = ComponentSite(node, spec, {}, [h], [torch.relu(h)], [Parts(groups, bias)], chunk=2, sums=sums, owned=[True])
    before = sums(groups)
    written = rule.decompose(site)[0]
    assert written.groups is groups and torch.equal(written.groups, fresh.groups)
    assert torch.equal(sums(groups), fresh.groups.sum(0)) and not torch.equal(sums(groups), before)


def test_a_weight_product_of_strided_groups_has_the_bits_of_the_rows_product():
    """Groups that reach a weight product transposed (a Bloom export's) are multiplied as one matrix of
    every group's rows, as a contiguous copy would be: the same bits as that product, and a result that
    owns its memory (an activation after it may write into it)."""
    from rulegraph.propagation.components import _direct
    g = torch.Generator().manual_seed(6)
    groups = torch.randn(4, 1, 6, 5, generator=g, dtype=torch.float64).transpose(2, 3)   # [G, 1, 5, 6], strided
    bias = torch.randn(1, 5, 6, generator=g, dtype=torch.float64)
    weight = torch.randn(6, 7, generator=g, dtype=torch.float64)
    x = groups.sum(0) + bias
    node, spec = Node("proj", "MatMul", ("x", "w"), ("y",), {}), lookup("MatMul")
    site = ComponentSite(node, spec, {}, [x, weight], [x @ weight], [Parts(groups, bias), None], chunk=4)
    out = _direct(site)[0]
    assert torch.equal(out.groups, (groups.reshape(-1, 6) @ weight).reshape(4, 1, 5, 7))
    assert not out.groups._is_view() and out.groups.is_contiguous()
