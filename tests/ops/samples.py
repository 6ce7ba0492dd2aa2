"""Torch-side calls of registered ops in float64, for the VJP and trait tests.

A :class:`Sample` is what the interpreter would hand an op: tensors (float64 for float
inputs), Python int lists for ``static`` inputs, ``None`` for omitted optional inputs, and
attributes as the ONNX loader normalises them (``Cast.to`` a torch dtype, ``coerce_2d``
for opset < 13 softmax, ``num_outputs`` for Split).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rulegraph.ops import REGISTRY, OpSpec

Tensor = torch.Tensor
_GEN = torch.Generator().manual_seed(1234)


def r(*shape, lo=None, away=None):
    """float64 normal values; ``lo``: uniform in [lo, lo+2]; ``away``: |x| ≥ away (no kinks/poles)."""
    if lo is not None:
        return lo + 2 * torch.rand(shape, generator=_GEN, dtype=torch.float64)
    x = torch.randn(shape, generator=_GEN, dtype=torch.float64)
    if away is not None:
        x = torch.where(x.abs() < away, torch.sign(x + 1e-3) * (away + x.abs()), x)
    return x


def distinct(*shape):
    """float64 values, pairwise distinct (no ties for Max/TopK)."""
    n = 1
    for s in shape:
        n *= s
    return (torch.randperm(n, generator=_GEN).to(torch.float64) * 0.37 - n * 0.15).reshape(shape)


def idx(*values):
    return torch.tensor(values, dtype=torch.int64)


def cond(*shape):
    return torch.rand(shape, generator=_GEN) < 0.5


@dataclass
class Sample:
    op: str
    inputs: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    fd: bool = True                     # finite differences are meaningful (smooth at these inputs)
    first_output_only: bool = False     # relevance only ever flows through output 0 (LN's statistics)
    # torch's native_layer_norm backward ignores cotangents on its mean/rstd outputs, so autograd
    # is compared on output 0 only; finite differences check the statistics' part of the VJP
    autograd_outputs: int | None = None
    domain: str = ""                    # rulegraph's own ops: ai.rulegraph

    @property
    def spec(self) -> OpSpec:
        return REGISTRY[(self.domain, self.op)]

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}" if self.name else self.op

    def float_inputs(self) -> list[int]:
        return [i for i, x in enumerate(self.inputs) if isinstance(x, Tensor) and x.is_floating_point()]

    def call(self, inputs=None) -> list[Tensor]:
        out = self.spec.forward(*(self.inputs if inputs is None else inputs), **self.attrs)
        return list(out) if isinstance(out, (tuple, list)) else [out]


SAMPLES: list[Sample] = []


def sample(op, *inputs, **kw):
    SAMPLES.append(Sample(op, list(inputs), **kw))


BROADCAST = {"same": ((3, 4), (3, 4)), "row": ((2, 3, 4), (4,)), "col": ((2, 1, 4), (3, 1)),
             "scalar": ((), (2, 3)), "lead": ((1, 3), (2, 1, 3))}

# -- elementwise ---------------------------------------------------------------------------------
for _op in ("Add", "Sub", "Mul", "Div"):
    for _name, (_a, _b) in BROADCAST.items():
        sample(_op, r(*_a), r(*_b, away=0.5) if _op == "Div" else r(*_b), name=_name)
sample("Pow", r(3, 4, lo=0.3), r(3, 4), name="float")
sample("Pow", r(2, 3, 4, lo=0.3), r(4), name="broadcast")
sample("Pow", r(3, 4, lo=0.3), torch.tensor(2.0, dtype=torch.float64), name="square")
sample("Sum", r(2, 3, 4), r(3, 1), r(4), name="three")
sample("Sum", r(3, 4), name="one")
sample("Mean", r(2, 3, 4), r(3, 1), r(4), name="three")
sample("Max", distinct(2, 3, 4), distinct(3, 1) + 0.01, name="two")
sample("Mod", r(2, 3, 4) * 3, torch.tensor([1.5, -2.0, 2.5, 3.5], dtype=torch.float64), attrs={"fmod": 1}, fd=False)
sample("Min", distinct(2, 3, 4), distinct(4) + 0.01, name="two")
sample("Neg", r(3, 4))
for _op in ("Floor", "Ceil", "Round", "Sign"):  # piecewise constant: zero gradients
    sample(_op, r(3, 4) * 3, fd=False)
sample("Abs", r(3, 4, away=0.1))
sample("Reciprocal", r(3, 4, away=0.5))
sample("Sqrt", r(3, 4, lo=0.2))
sample("Exp", r(3, 4))
sample("Cos", r(3, 4) * 3)
sample("Sin", r(3, 4) * 3)
sample("Log", r(3, 4, lo=0.2))
sample("Erf", r(3, 4))
sample("Tanh", r(3, 4) * 2)
sample("Sigmoid", r(3, 4) * 2)
sample("Relu", r(3, 4, away=0.1))
sample("LeakyRelu", r(3, 4, away=0.1), attrs={"alpha": 0.2})
sample("Elu", r(3, 4, away=0.1), attrs={"alpha": 0.5})
sample("Softplus", r(3, 4))
sample("Gelu", r(3, 4) * 2, name="none")
sample("Gelu", r(3, 4) * 2, attrs={"approximate": "tanh"}, name="tanh")
sample("Clip", r(3, 4) * 2, torch.tensor(-0.5, dtype=torch.float64), torch.tensor(0.6, dtype=torch.float64),
       name="inputs", fd=False)
sample("Clip", r(3, 4) * 2, attrs={"min": -0.5, "max": 0.6}, name="attrs", fd=False)
sample("Clip", r(3, 4), name="none")
sample("Where", cond(2, 3, 4), r(3, 4), r(2, 1, 4), name="broadcast")
sample("Where", cond(4), r(3, 1), torch.tensor(0.5, dtype=torch.float64), name="cond_broadcast")
sample("Where", cond(3, 4), r(3, 4), r(3, 4), name="same")
sample("Identity", r(3, 4))
sample("Dropout", r(3, 4))
sample("Dropout", r(3, 4), torch.tensor(0.1, dtype=torch.float64), name="ratio")
sample("Cast", r(3, 4), attrs={"to": torch.float64}, name="same")
sample("Cast", r(3, 4).float(), attrs={"to": torch.float64}, name="widen", fd=False)  # float32 input: no FD
sample("CastLike", r(3, 4), torch.zeros(1, dtype=torch.float64))

sample("QuantizeDequantize", r(3, 4), r(3, 4) * 0.01, domain="ai.rulegraph")
sample("QuantizeDequantize", r(2, 3, 4), r(4) * 0.01, domain="ai.rulegraph", name="broadcast")

# -- matrix products -------------------------------------------------------------------------------
for _name, (_a, _b) in {"2d": ((3, 4), (4, 5)), "batched_2d": ((2, 3, 4), (4, 5)),
                        "batched": ((2, 3, 4), (2, 4, 5)), "batch_broadcast": ((2, 1, 3, 4), (5, 4, 2)),
                        "vec_mat": ((4,), (4, 5)), "mat_vec": ((3, 4), (4,)), "vec_vec": ((4,), (4,)),
                        "vec_batched": ((4,), (2, 4, 5)), "batched_vec": ((2, 3, 4), (4,)),
                        "k1": ((3, 1), (1, 5)), "vec_vec_k1": ((1,), (1,)), "vec_mat_k1": ((1,), (1, 3)),
                        "mat_vec_k1": ((3, 1), (1,)), "batched_k1": ((2, 3, 1), (1,))}.items():
    sample("MatMul", r(*_a), r(*_b), name=_name)
sample("Gemm", r(3, 4), r(4, 5), name="no_c")
sample("Gemm", r(3, 4), r(4, 5), r(5), name="c_row")
sample("Gemm", r(3, 4), r(4, 5), r(3, 5), name="c_full")
sample("Gemm", r(3, 4), r(4, 5), r(3, 1), name="c_col")
sample("Gemm", r(3, 4), r(4, 5), torch.tensor(0.7, dtype=torch.float64), name="c_scalar")
sample("Gemm", r(4, 3), r(4, 5), r(5), attrs={"transA": 1}, name="transA")
sample("Gemm", r(3, 4), r(5, 4), r(5), attrs={"transB": 1}, name="transB")
sample("Gemm", r(4, 3), r(5, 4), r(3, 5), attrs={"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, name="both")
sample("Gemm", r(2, 3, 4), r(5, 4), r(5), attrs={"transB": 1}, name="batched_linear")
sample("Einsum", r(2, 3, 4), r(2, 4, 5), attrs={"equation": "bij,bjk->bik"}, name="bmm")
sample("Einsum", r(3, 4), attrs={"equation": "ij->ji"}, name="transpose")

# -- softmax and normalisation ----------------------------------------------------------------------
sample("Softmax", r(2, 3, 4), attrs={"axis": -1}, name="last")
sample("Softmax", r(2, 3, 4), attrs={"axis": 1}, name="axis1")
sample("Softmax", r(2, 3, 4), attrs={"axis": 1, "coerce_2d": 1}, name="coerce_2d")
sample("Softmax", r(2, 3, 4), attrs={"axis": 0, "coerce_2d": 1}, name="coerce_2d_axis0")
sample("LogSoftmax", r(2, 3, 4), attrs={"axis": 1, "coerce_2d": 1}, name="coerce_2d")
_LN = {"autograd_outputs": 1, "first_output_only": True}
sample("LayerNormalization", r(2, 3, 4), r(4), r(4), attrs={"axis": -1}, name="bias", **_LN)
sample("LayerNormalization", r(2, 3, 4), r(4), attrs={"axis": -1}, name="no_bias", **_LN)
sample("LayerNormalization", r(2, 3, 4), r(3, 4), r(3, 4), attrs={"axis": -2, "epsilon": 1e-3}, name="axis-2",
       **_LN)
sample("LayerNormalization", r(2, 3, 4), r(3, 4), attrs={"axis": -2}, name="axis-2_no_bias", **_LN)
sample("LayerNormalization", r(2, 3, 4), r(1, 4), r(4), attrs={"axis": -2}, name="scale_broadcast",
       first_output_only=True)
sample("RMSNormalization", r(2, 3, 4), r(4))
sample("SimplifiedLayerNormalization", r(2, 3, 4), r(3, 4), attrs={"axis": 1})
sample("InstanceNormalization", r(2, 3, 5), r(3), r(3))

# -- reductions ------------------------------------------------------------------------------------
for _op in ("ReduceSum", "ReduceMean"):
    sample(_op, r(2, 3, 4), [1], attrs={"keepdims": 1}, name="keep1")
    sample(_op, r(2, 3, 4), [0, -1], attrs={"keepdims": 0}, name="keep0")
    sample(_op, r(2, 3, 4), attrs={"axes": [2, 0], "keepdims": 0}, name="attr_keep0")
    sample(_op, r(2, 3, 4), attrs={"keepdims": 0}, name="all")
    sample(_op, r(2, 3, 4), attrs={"noop_with_empty_axes": 1}, name="noop")
sample("ReduceMax", distinct(2, 3, 4), [1], attrs={"keepdims": 0})
sample("ReduceLogSumExp", r(2, 3, 4), [-1])
sample("ReduceL2", r(2, 3, 4), [0, 2])
sample("ReduceProd", r(2, 3, 4, lo=0.5), [1])

# -- routing -------------------------------------------------------------------------------------------
sample("Reshape", r(2, 3, 4), [0, -1], name="copy0")
sample("Reshape", r(2, 3, 4), [4, 6], name="plain")
sample("Flatten", r(2, 3, 4), attrs={"axis": 2})
sample("Flatten", r(2, 3, 4), attrs={"axis": 0}, name="axis0")
sample("Squeeze", r(1, 3, 1, 4), [0, -2], name="axes")
sample("Squeeze", r(1, 3, 1, 4), attrs={"axes": [2]}, name="attr")
sample("Squeeze", r(1, 3, 1, 4), name="all")
sample("Unsqueeze", r(3, 4), [3, 0], name="input")
sample("Unsqueeze", r(3, 4), attrs={"axes": [-1]}, name="attr")
sample("Transpose", r(2, 3, 4), name="default")
sample("Transpose", r(2, 3, 4, 5), attrs={"perm": [0, 2, 3, 1]}, name="perm")
sample("Concat", r(2, 3), r(2, 1), r(2, 4), attrs={"axis": -1}, name="neg_axis")
sample("Concat", r(2, 3), r(1, 3), attrs={"axis": 0}, name="axis0")
sample("Split", r(2, 6, 3), [1, 2, 3], attrs={"axis": 1}, name="sizes")
sample("Split", r(2, 6, 3), attrs={"axis": -2, "num_outputs": 3}, name="num_outputs")
sample("Split", r(7, 2), attrs={"axis": 0, "num_outputs": 3}, name="uneven")
sample("Split", r(2, 6), attrs={"axis": 1, "split": [4, 2]}, name="attr")
sample("Slice", r(5, 6, 4), [1], [4], name="basic")
sample("Slice", r(5, 6, 4), [0, 1], [6, 6], [1, 2], [2, 2], name="steps")
sample("Slice", r(5, 6, 4), [-1], [-2 ** 63], [1], [-1], name="reverse")
sample("Slice", r(5, 6, 4), [4, 0], [0, 4], [0, 2], [-2, 3], name="mixed_neg")
sample("Slice", r(5, 6, 4), [-100], [-200], [1], [-1], name="neg_clamped")
sample("Slice", r(5, 6, 4), attrs={"starts": [1, 0], "ends": [4, 3], "axes": [0, 2]}, name="legacy")
sample("Gather", r(6, 4), idx(0, 5, 2, 2), name="rows_dup")
sample("Gather", r(6, 4), torch.tensor(3), name="scalar_index")
sample("Gather", r(6, 4), torch.tensor(-2), name="scalar_neg")
sample("Gather", r(6, 4), idx(-1, 3, -1), name="neg")
sample("Gather", r(3, 4), idx(1, -1, 0, 1), attrs={"axis": 1}, name="axis1")
sample("Gather", r(2, 3, 4), torch.tensor([[0, -1], [2, 2]]), attrs={"axis": 1}, name="axis1_2d")
sample("Gather", r(2, 3, 4), torch.tensor(1), attrs={"axis": -1}, name="axis_neg_scalar")
sample("GatherElements", r(3, 4), torch.tensor([[0, 1, 2, 0], [2, 2, 1, 0]]), attrs={"axis": 0}, name="axis0_dup")
sample("GatherElements", r(3, 4), torch.tensor([[3, 0], [1, 1], [-1, -4]]), attrs={"axis": 1}, name="axis1_neg")
sample("GatherElements", r(3, 4), torch.tensor([[0, 1], [2, 0]], dtype=torch.int32), attrs={"axis": 0}, name="int32")
sample("GatherND", r(2, 3, 4), torch.tensor([[0, 1], [1, -1], [0, 1]]), name="k2_dup")
sample("GatherND", r(2, 3, 4), torch.tensor([[1], [2]]), attrs={"batch_dims": 1}, name="batch1")
sample("Expand", r(3, 1), [2, 3, 4], name="higher_rank")
sample("Expand", r(2, 1, 4), [3, 1], name="bidirectional")
sample("Tile", r(2, 3), [2, 3])
sample("Pad", r(3, 4), [1, 0, 2, 1], torch.tensor(-2.0, dtype=torch.float64), name="constant_value")
sample("Pad", r(3, 4), [1, 0, 2, 1], name="constant_default")
sample("Pad", r(3, 4), [-1, 1, 0, -2], torch.tensor(0.5, dtype=torch.float64), name="negative")
sample("Pad", r(3, 4), [2, 1], torch.tensor(3.0, dtype=torch.float64), [1], name="axes")
sample("Pad", r(3, 4), [1, 2, 2, 1], attrs={"mode": "reflect"}, name="reflect")
sample("Pad", r(3, 4), [1, 2, 2, 1], attrs={"mode": "edge"}, name="edge")
sample("Pad", r(3, 4), [1, 2, 3, 1], attrs={"mode": "wrap"}, name="wrap")
sample("Pad", r(3, 4), attrs={"pads": [1, 0, 0, 1], "mode": "edge"}, name="legacy_edge")

# -- other float-valued ops ------------------------------------------------------------------------------
sample("Trilu", r(2, 4, 5), torch.tensor(1), name="upper")
sample("Trilu", r(4, 5), attrs={"upper": 0}, name="lower")
sample("CumSum", r(3, 4), torch.tensor(1), attrs={"exclusive": 1, "reverse": 1}, name="ex_rev")
sample("CumSum", r(3, 4), torch.tensor(-2), name="plain")
sample("ScatterND", r(4, 3), torch.tensor([[1], [3]]), r(2, 3), name="rows")
sample("ScatterND", r(4, 3), torch.tensor([[1], [3], [1]]), r(3, 3), attrs={"reduction": "add"}, name="add")
sample("ScatterElements", r(3, 4), torch.tensor([[1, 0, 3], [-1, 2, 0]]), r(2, 3), attrs={"axis": 1}, name="axis1")
sample("ScatterElements", r(3, 4), torch.tensor([[1, 0, 2, 1], [1, 0, 2, 0]]), r(2, 4), attrs={"reduction": "add"},
       name="add")
sample("ScatterElements", r(3, 4), torch.tensor([[1, 0, 2, 1], [1, 0, 2, 0]]), r(2, 4), attrs={"reduction": "max"},
       name="max")
sample("TopK", distinct(3, 5), [2], attrs={"axis": -1}, name="values")
sample("OneHot", torch.tensor([0, 2, -1]), [4], r(2), name="float_values")
sample("ConstantOfShape", [2, 3], attrs={"value": torch.tensor([1.5], dtype=torch.float64)}, name="float")
sample("Range", torch.tensor(0.5, dtype=torch.float64), torch.tensor(2.1, dtype=torch.float64),
       torch.tensor(0.25, dtype=torch.float64), name="float")

# -- vision ----------------------------------------------------------------------------------------
sample("Conv", r(1, 2, 5, 4), r(3, 2, 3, 3), r(3), attrs={"pads": [1, 1, 1, 1], "strides": [2, 1]}, name="2d")
sample("Conv", r(1, 4, 6), r(4, 2, 3), attrs={"group": 2, "dilations": [2], "pads": [0, 1]}, name="1d_groups")
sample("ConvTranspose", r(1, 3, 3, 4), r(3, 2, 3, 3), r(2), attrs={"strides": [2, 2], "pads": [1, 0, 1, 0]}, name="2d")
sample("AveragePool", r(1, 2, 6, 7), attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
sample("MaxPool", distinct(1, 2, 7, 7), attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
sample("GlobalAveragePool", r(2, 3, 4, 5))
sample("GlobalMaxPool", distinct(2, 3, 4, 5))
sample("BatchNormalization", r(2, 3, 4, 5), r(3), r(3), r(3), r(3, lo=0.5))
sample("HardSigmoid", r(3, 4, away=0.1) * 2, fd=False)
sample("HardSwish", r(3, 4, away=0.1) * 2, fd=False)
sample("Resize", r(1, 2, 4, 5), None, [1.0, 1.0, 2.0, 1.5], attrs={"mode": "linear"}, name="linear")
sample("Resize", r(1, 2, 4, 5), None, None, [1, 2, 6, 3], attrs={"mode": "nearest"}, name="nearest")

# -- recurrent cells (their VJP is autograd through the recurrence; finite differences check it) ----------
_H = 3
sample("LSTM", r(4, 2, 3), r(2, 4 * _H, 3) * 0.6, r(2, 4 * _H, _H) * 0.6, r(2, 8 * _H), torch.tensor([4, 2], dtype=torch.int32),
       r(2, 2, _H), r(2, 2, _H), r(2, 3 * _H), attrs={"direction": "bidirectional", "hidden_size": _H},
       name="bidirectional_lens_peepholes")
sample("LSTM", r(2, 4, 3), r(1, 4 * _H, 3) * 0.6, r(1, 4 * _H, _H) * 0.6, attrs={"layout": 1, "direction": "reverse"},
       name="layout1_reverse")
sample("GRU", r(4, 2, 3), r(2, 3 * _H, 3) * 0.6, r(2, 3 * _H, _H) * 0.6, r(2, 6 * _H), torch.tensor([3, 4], dtype=torch.int32),
       r(2, 2, _H), attrs={"direction": "bidirectional"}, name="bidirectional_lens")
sample("GRU", r(4, 2, 3), r(1, 3 * _H, 3) * 0.6, r(1, 3 * _H, _H) * 0.6, r(1, 6 * _H), None, r(1, 2, _H),
       attrs={"linear_before_reset": 1}, name="linear_before_reset")
sample("RNN", r(4, 2, 3), r(1, _H, 3) * 0.6, r(1, _H, _H) * 0.6, r(1, 2 * _H), torch.tensor([2, 4], dtype=torch.int32),
       attrs={"direction": "reverse"}, name="reverse_lens")
sample("DynamicQuantizeLSTM", r(4, 2, 3), torch.randint(-127, 128, (1, 3, 4 * _H), generator=_GEN, dtype=torch.int8),
       torch.randint(-127, 128, (1, _H, 4 * _H), generator=_GEN, dtype=torch.int8), r(1, 8 * _H), None, r(1, 2, _H),
       r(1, 2, _H), None, torch.tensor([0.005], dtype=torch.float64), torch.tensor([0], dtype=torch.int8),
       torch.tensor([0.006], dtype=torch.float64), torch.tensor([0], dtype=torch.int8), domain="com.microsoft")
