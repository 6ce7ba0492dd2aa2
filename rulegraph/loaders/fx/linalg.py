"""Lowerings of embeddings, linear layers and products: ``embedding`` → ``Gather``,
``linear`` → ``Gemm`` or ``MatMul`` (+ ``Add``), ``addmm`` → ``Gemm``, ``matmul`` /
``mm`` / ``bmm`` → ``MatMul``, ``einsum`` → ``Einsum``.
"""
from __future__ import annotations

import torch.fx as fx

from .builder import Builder, lowers, out_dtype, rank


# -- embeddings, linear layers, products ----------------------------------------------------------------

@lowers("aten.embedding.default")
def _embedding(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Gather", [b.value(a["weight"]), b.value(a["indices"])])


@lowers("aten.linear.default")
def _linear(b: Builder, n: fx.Node, a: dict) -> str:
    x, w, bias = a["input"], a["weight"], a["bias"]
    if rank(x) == 2 and bias is not None:   # what both ONNX exporters emit for 2-D inputs
        return b.emit("Gemm", [b.value(x), b.value(w), b.value(bias)], alpha=1.0, beta=1.0, transB=1)
    wt = b.transposed_weight(w)
    if bias is None:
        return b.emit("MatMul", [b.value(x), wt])
    product = b.emit("MatMul", [b.value(x), wt], "matmul")
    return b.emit("Add", [b.value(bias), product])


@lowers("aten.addmm.default")
def _addmm(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Gemm", [b.value(a["mat1"]), b.value(a["mat2"]), b.value(a["self"])],
                  alpha=float(a["alpha"]), beta=float(a["beta"]))


@lowers("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
def _matmul(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("MatMul", [b.tensor(n.args[0], dtype, "a"), b.tensor(n.args[1], dtype, "b")])


@lowers("aten.einsum.default")
def _einsum(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Einsum", [b.value(t) for t in a["tensors"]], equation=a["equation"])
