"""``OpSpec.size``: the number of elements an op's output will have, computed from its arguments
before the op runs (the interpreter refuses a tensor over the budget before allocating it,
:mod:`rulegraph.limits`), equals the number of elements the op then returns."""
from __future__ import annotations

import pytest
import torch

from rulegraph.ops import REGISTRY

from .samples import SAMPLES, r
from .test_traits import NON_FLOAT

#: ops declaring a size that the trait samples leave out (their outputs are not float, or not routed)
EXTRA = [("Mod", [r(2, 3, 4), r(4, lo=0.5)], {}), ("Mod", [torch.arange(6).reshape(2, 3), torch.tensor([4])], {}),
         ("Range", [torch.tensor(10), torch.tensor(-3), torch.tensor(-4)], {}),
         ("Range", [torch.tensor(0), torch.tensor(5), torch.tensor(-1)], {}),
         ("MatMul", [r(4), r(4, 3)], {}), ("MatMul", [r(2, 1, 3, 4), r(5, 4, 2)], {}),
         ("Gather", [r(2, 3, 4), torch.tensor([[0, 1], [2, 2]])], {"axis": -2}),
         ("ConstantOfShape", [[0, 3]], {})]

CASES = [pytest.param(s.op, s.inputs, s.attrs, id=s.id) for s in SAMPLES if s.spec.size is not None]
CASES += [pytest.param(op, inputs, attrs, id=f"{op}-nonfloat") for op, inputs, attrs in NON_FLOAT
          if REGISTRY[("", op)].size is not None]
CASES += [pytest.param(op, inputs, attrs, id=f"{op}-extra{k}") for k, (op, inputs, attrs) in enumerate(EXTRA)]


def test_every_op_declaring_a_size_is_checked():
    declared = {name for (_, name), spec in REGISTRY.items() if spec.size is not None}
    checked = {c.values[0] for c in CASES}
    assert declared <= checked, f"ops declaring size= without a case here: {sorted(declared - checked)}"
    assert {"Expand", "ConstantOfShape", "Tile", "Range", "Pad", "OneHot", "Resize", "Add", "MatMul"} <= declared


@pytest.mark.parametrize("op, inputs, attrs", CASES)
def test_the_declared_size_is_the_output_size(op, inputs, attrs):
    spec = REGISTRY[("", op)]
    attrs = {**spec.defaults, **attrs}
    out = spec.forward(*inputs, **attrs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert spec.size(list(inputs), attrs) == out.numel()


def test_the_broadcast_size_is_torchs_for_any_shapes():
    """Two or three right-aligned shapes drawn from one broadcast shape (dims of 0, 1 and more, some
    stretched from 1, some left off in front): the count is that of torch's broadcast."""
    from rulegraph.ops.spec import broadcast_size
    g = torch.Generator().manual_seed(0)
    for _ in range(500):
        rank = int(torch.randint(0, 5, (1,), generator=g))
        full = torch.randint(0, 4, (rank,), generator=g).tolist()
        shapes = []
        for _ in range(int(torch.randint(2, 4, (1,), generator=g))):
            keep = int(torch.randint(0, rank + 1, (1,), generator=g))
            ones = torch.rand(keep, generator=g) < 0.4
            shapes.append([1 if one else d for d, one in zip(full[rank - keep:], ones.tolist())])
        args = [torch.empty(s) for s in shapes]
        assert broadcast_size(args, {}) == torch.broadcast_shapes(*map(tuple, shapes)).numel(), shapes
