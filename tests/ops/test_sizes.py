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
