"""torch.export program (or its fx GraphModule) → IR, with ONNX op names.

Every aten call in the program *as exported* (the pre-dispatch IR: ``aten.linear``,
``aten.layer_norm``, ``aten.scaled_dot_product_attention``…; no decompositions are
run) is lowered through one table, :data:`LOWERINGS`, from the target's name
(``"aten.linear.default"``) to a small function that emits IR nodes with ONNX op
types and attribute names. The lowerings mirror what torch's ONNX exporters emit at
the graph's opset (18 by default), so one rule file gives the same relevance on an
fx export and on an ONNX export of the same model:

* ``aten.linear`` → ``MatMul(x, Wᵀ)`` + ``Add(b, ·)`` (``Wᵀ`` a new constant named
  ``<weight>.T``); on 2-D inputs with a bias ``Gemm(x, W, b, transB=1)``, as both
  exporters do. ``aten.addmm`` → ``Gemm``.
* ``aten.gelu`` → ``x·½(1 + erf(x/√2))`` as ``Div → Erf → Add → Mul → Mul`` (the tanh
  form likewise), as the exporters emit before opset 20; ``Gelu`` from opset 20.
* ``aten.scaled_dot_product_attention`` → ``MatMul(q, kᵀ) → Mul(scale) →
  Add(float mask) | Where(bool mask, ·, −inf) [→ Where(causal, ·, −inf)] →
  Softmax → MatMul(·, v)``: the eager-attention pattern, so the attention-head rule
  (``MatMul`` whose input 0 comes from ``Softmax``) matches.
* CNNs (``vision.py``): ``aten.conv2d`` → ``Conv``, ``batch_norm`` → ``BatchNormalization``
  (folded by the CNN rule sets' canonizer), pooling, ``hardswish`` / ``hardsigmoid`` → ``HardSwish`` /
  ``HardSigmoid``, ``relu6`` → ``Clip``; ``aten.silu`` → ``x · Sigmoid(x)`` as the exporters write it.

Symbolic sizes: ``aten.sym_size.int(x, d)`` becomes ``Shape(x, start=d, end=d+1)``,
a 1-element int64 tensor; Python arithmetic on SymInts becomes the matching ONNX op
on those tensors; a size list mixing ints and symbols becomes a ``Concat`` of
1-element pieces. Where a symbol is used as a scalar (``Range``, a ``Gather``
index, an operand of an elementwise op) it is squeezed to 0-d first. All of this
depends only on the input shapes, so the interpreter computes it once per shape.

Names: the node computing an fx node's result keeps the fx node's name
(``linear_3``) and so does its output value; extra nodes a lowering emits are named
``<fx name>.<role>`` (``linear_3.matmul``, ``scaled_dot_product_attention.softmax``,
``view.shape``), and constants it creates likewise; the outputs of a multi-output
node are ``<name>.0``, ``<name>.1``…. Parameters and buffers keep their state-dict
names (``model.bert.pooler.dense.weight``). Each node's ``scope`` is the innermost
module path of its fx node (``model.bert.encoder.layer.0.attention.self.query``).

Float constants the loader creates (scalars, fill values) are stored in float64;
the interpreter runs every float in the plan's dtype, so a float64 run is exact.
Asserts (``_assert_tensor_metadata``, ``_assert_scalar``…) are dropped, dropout and
copies become ``Identity``, and nodes whose results nothing uses are removed.
"""
from __future__ import annotations

from .builder import LOWERINGS, lowers
# each family module fills LOWERINGS on import (in this order: the table's order)
from . import basic, linalg, nn, elementwise, reduce, shape, vision  # noqa: F401
from .program import load_fx

__all__ = ["LOWERINGS", "load_fx", "lowers"]
