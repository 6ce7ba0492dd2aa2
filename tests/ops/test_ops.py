"""Every registered op, one node at a time, against onnxruntime.

Each case runs in up to three layouts (graph inputs / data input only / all
initializers, the last constant-folded at prepare time) in float32, and once more
with the plan in float64 against a double reference. Cases onnxruntime cannot run
(no kernel for that op, type or opset) are skipped with the reason.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rulegraph.ops import REGISTRY

from .onnx_harness import Case, check_case, check_case_f64
from .test_recurrent import RECURRENT_OPS
from .test_sequences import SEQUENCE_OPS

RNG = np.random.default_rng(20240611)
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def f(*shape, lo=None):
    """float32 normal values (or uniform in [lo, lo+2] if ``lo`` is given)."""
    if lo is not None:
        return (lo + 2 * RNG.random(shape)).astype(np.float32)
    return RNG.standard_normal(shape).astype(np.float32)


def distinct(*shape):
    """float32 values that are pairwise distinct (no ties for ArgMax/TopK)."""
    n = int(np.prod(shape))
    return (RNG.permutation(n).astype(np.float32) * 0.25 - n / 8).reshape(shape)


def i64(*values):
    return np.array(values, dtype=np.int64)


def scalar(v, dtype=np.int64):
    return np.array(v, dtype=dtype)


def ints(*shape, lo=-5, hi=6, dtype=np.int64):
    return RNG.integers(lo, hi, shape).astype(dtype)


def bools(*shape):
    return RNG.random(shape) < 0.5


def value_tensor(v, dtype):
    return numpy_helper.from_array(np.array([v], dtype=dtype), "value")


CASES: list[Case] = []


def case(op, *inputs, **kw):
    CASES.append(Case(op, list(inputs), **kw))


# -- elementwise arithmetic with broadcasting -------------------------------------------------
BROADCAST = {"same": ((3, 4), (3, 4)), "row": ((2, 3, 4), (4,)), "col": ((2, 1, 4), (3, 1)),
             "scalar": ((), (2, 3)), "lead": ((1, 3), (2, 1, 3))}
for _op in ("Add", "Sub", "Mul", "Div"):
    for _name, (_a, _b) in BROADCAST.items():
        _y = f(*_b)
        if _op == "Div":
            _y = np.where(np.abs(_y) < 0.3, 0.7, _y).astype(np.float32)
        case(_op, f(*_a), _y, name=_name)
    case(_op, ints(2, 3), np.where(ints(3) == 0, 3, ints(3)), name="int64")
case("Add", f(2, 3), f(2, 3), name="op13", opset=13)
case("Div", i64(7, -7, 7, -7, 0, 9), i64(2, 2, -2, -2, 3, 4), name="int_trunc")
case("Div", ints(4, dtype=np.int32), np.array([3, -3, 2, 5], dtype=np.int32), name="int32")

case("Pow", f(3, 4, lo=0.2), f(3, 4), name="float")
case("Pow", f(2, 3, 4, lo=0.2), f(4), name="broadcast")
case("Pow", f(3, 4), np.array(2.0, np.float32), name="square")
case("Pow", f(3, 4), np.array(3, np.int64), name="int_exp")
case("Pow", np.array([-2.0, -1.5, 0.0, 3.0], np.float32), np.array([3.0, 2.0, 2.0, 0.5], np.float32), name="neg_base")
case("Pow", ints(5, lo=-3, hi=4), i64(0, 1, 2, 3, 2), name="int")

for _op in ("Sum", "Mean", "Max", "Min"):
    case(_op, f(2, 3, 4), f(3, 1), f(4), name="three")
    case(_op, f(3, 4), name="one")
    case(_op, f(2, 3), f(2, 3), name="two", opset=13)
case("Max", ints(3, 4), ints(4), name="int")
case("Min", ints(3, 4), ints(4), name="int")

case("Mod", ints(3, 4, lo=-9, hi=10), np.where(ints(4) == 0, 4, ints(4)), name="int")
case("Mod", i64(5, -5, 5, -5), i64(3, 3, -3, -3), name="signs")
case("Mod", f(3, 4) * 5, np.array([1.5, -2.0, 2.5, 3.0], np.float32), attrs={"fmod": 1}, name="fmod")
case("Mod", i64(5, -5, 5, -5), i64(3, 3, -3, -3), attrs={"fmod": 1}, name="fmod_int")

for _op in ("Neg", "Abs", "Sign"):
    case(_op, f(3, 4), name="float")
    case(_op, ints(3, 4), name="int")
case("Sign", np.array([0.0, -0.0, 2.0, -3.0], np.float32), name="zero")
case("Reciprocal", np.where(np.abs(_x := f(3, 4)) < 0.3, 0.5, _x).astype(np.float32))
case("Sqrt", f(3, 4, lo=0.0))
case("Exp", f(3, 4))
case("Cos", f(3, 4) * 3)
case("Sin", f(3, 4) * 3)
case("Log", f(3, 4, lo=0.1))
case("Floor", f(3, 4) * 3)
case("Ceil", f(3, 4) * 3)
case("Round", np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6, -2.6], np.float32), name="half_even")
case("Erf", f(3, 4))
case("Erf", f(3, 4), opset=13, name="op13")
case("Tanh", f(3, 4) * 3)
case("Sigmoid", f(3, 4) * 3)
case("Relu", f(3, 4))
case("Relu", ints(3, 4, dtype=np.int32), name="int32", opset=14)
case("LeakyRelu", f(3, 4))
case("LeakyRelu", f(3, 4), attrs={"alpha": 0.2}, name="alpha")
case("Elu", f(3, 4))
case("Elu", f(3, 4), attrs={"alpha": 0.5}, name="alpha")
case("Softplus", f(3, 4) * 4)
case("Gelu", f(3, 4) * 3, opset=20)
# onnxruntime's double kernel uses float32 constants (0.044715f, √(2/π) as float): 1e-8 apart
case("Gelu", f(3, 4) * 3, attrs={"approximate": "tanh"}, opset=20, name="tanh", f64_rtol=1e-7, f64_atol=1e-8)

# Clip: attributes before opset 11, optional inputs after
_x = f(3, 4) * 2
case("Clip", _x, attrs={"min": -0.5, "max": 0.5}, opset=6, name="attrs")
case("Clip", _x, attrs={"min": -0.5}, opset=6, name="attr_min")
case("Clip", _x, opset=6, name="attr_none")
case("Clip", _x, np.array(-0.5, np.float32), np.array(0.5, np.float32), opset=13, name="both")
case("Clip", _x, np.array(-0.5, np.float32), opset=13, name="min")
case("Clip", _x, None, np.array(0.5, np.float32), opset=13, name="max")
case("Clip", _x, opset=13, name="none")
case("Clip", _x, np.array(1.0, np.float32), np.array(-1.0, np.float32), opset=13, name="min_gt_max")
case("Clip", ints(3, 4), scalar(-2), scalar(3), opset=13, name="int")

# -- comparisons and logic -----------------------------------------------------------------------
_a, _b = ints(2, 3, 4, lo=-2, hi=3), ints(4, lo=-2, hi=3)
for _op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
    case(_op, _a.astype(np.float32), _b.astype(np.float32), name="float")
    case(_op, _a, _b, name="int")
case("Equal", bools(3, 4), bools(4), name="bool")
case("Equal", f(2, 3), f(2, 3), name="op11", opset=11)
for _op in ("And", "Or", "Xor"):
    case(_op, bools(2, 3, 4), bools(3, 1))
case("Not", bools(3, 4))
case("BitwiseAnd", ints(3, 4, lo=0, hi=16), ints(4, lo=0, hi=16))
case("BitwiseOr", ints(3, 4, lo=-8, hi=16), ints(4, lo=0, hi=16))
case("BitwiseAnd", ints(3, 4, lo=0, hi=16, dtype=np.int32), ints(4, lo=0, hi=16, dtype=np.int32), name="int32")
_special = np.array([1.0, np.nan, np.inf, -np.inf, 0.0, -2.0], np.float32)
case("IsNaN", f(3, 4), name="finite")
case("IsNaN", _special, layouts=("const",), name="special")
case("IsInf", f(3, 4), name="finite")
for _neg, _pos in ((1, 1), (1, 0), (0, 1), (0, 0)):
    case("IsInf", _special, attrs={"detect_negative": _neg, "detect_positive": _pos}, layouts=("const",),
         name=f"neg{_neg}_pos{_pos}")
case("Where", bools(2, 3, 4), f(3, 4), f(2, 1, 4), name="broadcast")
case("Where", bools(4), f(3, 1), np.array(0.5, np.float32), name="cond_broadcast")
case("Where", bools(3, 4), ints(3, 4), ints(4), name="int")
case("Where", bools(3, 4), f(3, 4), f(3, 4), opset=9, name="op9")

# -- identity-like and casts ------------------------------------------------------------------
case("Identity", f(3, 4))
case("Identity", ints(3, 4), name="int")
case("Dropout", f(3, 4), opset=13)
case("Dropout", f(3, 4), np.array(0.3, np.float32), opset=13, name="ratio")
case("Dropout", f(3, 4), n_outputs=2, opset=13, name="mask")
case("Dropout", f(3, 4), n_outputs=2, opset=12, name="mask_op12")
_castable = np.array([[2.7, -2.7, 0.0, 0.4], [-0.6, 100.5, -100.5, 1.0]], np.float32)
for _to in (TensorProto.INT64, TensorProto.INT32, TensorProto.INT8, TensorProto.BOOL, TensorProto.DOUBLE,
            TensorProto.FLOAT):
    case("Cast", _castable, attrs={"to": _to}, name=f"float_to_{TensorProto.DataType.Name(_to).lower()}")
case("Cast", _castable, attrs={"to": TensorProto.FLOAT16}, rtol=1e-3, f64=False, name="float_to_float16")
case("Cast", ints(3, 4), attrs={"to": TensorProto.FLOAT}, name="int64_to_float")
case("Cast", ints(3, 4), attrs={"to": TensorProto.INT32}, name="int64_to_int32")
case("Cast", ints(3, 4), attrs={"to": TensorProto.BOOL}, name="int64_to_bool")
case("Cast", bools(3, 4), attrs={"to": TensorProto.FLOAT}, name="bool_to_float")
case("Cast", bools(3, 4), attrs={"to": TensorProto.INT64}, name="bool_to_int64")
case("Cast", ints(3, 4, dtype=np.int32), attrs={"to": TensorProto.INT64}, opset=13, name="int32_to_int64")
case("CastLike", _castable, i64(0), opset=15, name="to_int64")
case("CastLike", ints(3, 4), np.zeros(1, np.float32), opset=15, name="to_float")
case("CastLike", _castable, np.zeros(1, np.bool_), opset=15, name="to_bool")

# -- matrix products -----------------------------------------------------------------------------
for _name, (_a, _b) in {"2d": ((3, 4), (4, 5)), "batched_2d": ((2, 3, 4), (4, 5)),
                        "batched": ((2, 3, 4), (2, 4, 5)), "batch_broadcast": ((2, 1, 3, 4), (5, 4, 2)),
                        "vec_mat": ((4,), (4, 5)), "mat_vec": ((3, 4), (4,)), "vec_vec": ((4,), (4,)),
                        "vec_batched": ((4,), (2, 4, 5)), "batched_vec": ((2, 3, 4), (4,)),
                        "k1": ((3, 1), (1, 5)), "vec_vec_k1": ((1,), (1,))}.items():
    case("MatMul", f(*_a), f(*_b), name=_name)
case("MatMul", f(3, 4), f(4, 5), opset=13, name="op13")

for _opset in (11, 13):
    case("Gemm", f(3, 4), f(4, 5), opset=_opset, name="no_c")
    case("Gemm", f(3, 4), f(4, 5), f(5), opset=_opset, name="c_row")
for _name, _c in {"c_full": f(3, 5), "c_1x5": f(1, 5), "c_3x1": f(3, 1), "c_scalar": np.array(0.7, np.float32)}.items():
    case("Gemm", f(3, 4), f(4, 5), _c, name=_name)
case("Gemm", f(4, 3), f(4, 5), f(5), attrs={"transA": 1}, name="transA")
case("Gemm", f(3, 4), f(5, 4), f(5), attrs={"transB": 1}, name="transB")
case("Gemm", f(4, 3), f(5, 4), f(3, 5), attrs={"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, name="both")
case("Gemm", f(3, 4), f(4, 5), f(5), attrs={"alpha": -1.5, "beta": 0.0}, name="beta0")
case("Gemm", f(3, 4), f(4, 5), attrs={"alpha": 2.0}, name="alpha_no_c")

for _eq, _shapes in {"ij,jk->ik": ((3, 4), (4, 5)), "bij,bjk->bik": ((2, 3, 4), (2, 4, 5)),
                     "i,j->ij": ((3,), (4,)), "bhqd,bhkd->bhqk": ((1, 2, 3, 4), (1, 2, 5, 4)),
                     "ij->ji": ((3, 4),), "ij->": ((3, 4),), "ii->i": ((3, 3),),
                     "...ij,...jk->...ik": ((2, 3, 4), (2, 4, 5)),
                     "...ij,jk->...ik": ((2, 2, 3, 4), (4, 5)),
                     "ij,ij->i": ((3, 4), (3, 4))}.items():
    # onnx shape inference rejects an ellipsis that stands for different ranks; onnxruntime runs it
    case("Einsum", *[f(*s) for s in _shapes], attrs={"equation": _eq}, opset=12, check="..." not in _eq,
         name=_eq.replace(",", "_").replace("->", "_to_").replace(".", "d") or "all")

# -- softmax and normalisation ------------------------------------------------------------------
for _op in ("Softmax", "LogSoftmax"):
    case(_op, f(2, 3, 4), opset=11, name="default_axis")
    case(_op, f(2, 3, 4), attrs={"axis": 0}, opset=11, name="axis0")
    case(_op, f(2, 3, 4), attrs={"axis": -1}, opset=11, name="axis_last")
    case(_op, f(2, 3, 4, 5), attrs={"axis": 2}, opset=12, name="axis2")
    case(_op, f(2, 3, 4), opset=13, name="default_axis")
    case(_op, f(2, 3, 4), attrs={"axis": 1}, opset=13, name="axis1")
    case(_op, f(2, 3, 4), attrs={"axis": -3}, opset=18, name="axis_neg")

case("LayerNormalization", f(2, 3, 4), f(4), f(4), opset=17, name="bias")
case("LayerNormalization", f(2, 3, 4), f(4), opset=17, name="no_bias")
case("LayerNormalization", f(2, 3, 4), f(3, 4), f(3, 4), attrs={"axis": -2}, opset=17, name="axis-2")
case("LayerNormalization", f(2, 3, 4), f(3, 4), attrs={"axis": 1, "epsilon": 1e-3}, opset=18, name="axis1_no_bias")
case("LayerNormalization", f(2, 3, 4), f(4), f(4), attrs={"axis": 2, "epsilon": 0.1}, n_outputs=3, opset=17,
     name="stats")
case("LayerNormalization", f(2, 3, 4), f(3, 4), f(3, 4), attrs={"axis": 1}, n_outputs=3, opset=17, name="stats_axis1")
case("LayerNormalization", f(2, 3, 4), f(1, 4), f(4), attrs={"axis": -2}, opset=17, name="scale_broadcast")
case("LayerNormalization", f(2, 3, 4), f(4), f(4), attrs={"axis": 0}, opset=17, name="axis0")
case("RMSNormalization", f(2, 3, 4), f(4), opset=23)
case("RMSNormalization", f(2, 3, 4), f(3, 4), attrs={"axis": -2, "epsilon": 1e-3}, opset=23, name="axis-2")
case("SimplifiedLayerNormalization", f(2, 3, 4), f(4), opset=18, check=False)
case("SimplifiedLayerNormalization", f(2, 3, 4), f(3, 4), attrs={"axis": 1, "epsilon": 1e-3}, opset=18, check=False,
     name="axis1")
case("InstanceNormalization", f(2, 3, 4, 5), f(3), f(3), opset=6)
case("InstanceNormalization", f(2, 3, 5), f(3), f(3), attrs={"epsilon": 1e-2}, opset=6, name="1d")

# -- reductions ---------------------------------------------------------------------------------
_REDUCERS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
             "ReduceL1", "ReduceL2", "ReduceLogSumExp")
for _op in _REDUCERS:
    _input_from = 13 if _op == "ReduceSum" else 18
    _x = f(2, 3, 4) if _op != "ReduceProd" else f(2, 3, 4, lo=0.5)
    # axes as an attribute
    case(_op, _x, attrs={"axes": [1]}, opset=_input_from - 1, name="attr")
    case(_op, _x, attrs={"axes": [0, -1], "keepdims": 0}, opset=_input_from - 1, name="attr_keep0")
    case(_op, _x, opset=_input_from - 1, name="attr_all")
    # axes as an input
    case(_op, _x, i64(1), opset=_input_from, name="input")
    case(_op, _x, i64(-1, 0), attrs={"keepdims": 0}, opset=_input_from, name="input_keep0")
    case(_op, _x, opset=_input_from, name="input_all")
    case(_op, _x, attrs={"keepdims": 0}, opset=_input_from, name="input_all_keep0")
    case(_op, _x, attrs={"noop_with_empty_axes": 1}, opset=_input_from, name="noop")
    case(_op, _x, np.zeros(0, np.int64), attrs={"noop_with_empty_axes": 1}, opset=_input_from, name="noop_empty")
    case(_op, _x, np.zeros(0, np.int64), opset=_input_from, name="empty_axes")
case("ReduceMax", ints(2, 3, 4), i64(1), name="int")
case("ReduceSum", ints(2, 3, 4), i64(0, 2), name="int")
case("ReduceMean", f(2, 3, 4), attrs={"axes": [2, 1]}, opset=11, name="two_axes")

# -- shapes ---------------------------------------------------------------------------------------
_x = f(2, 3, 4, 5)
case("Shape", _x, opset=13)
for _start, _end in ((1, None), (None, -1), (-3, 3), (-10, 10), (2, 1), (0, 0)):
    _attrs = {k: v for k, v in (("start", _start), ("end", _end)) if v is not None}
    case("Shape", _x, attrs=_attrs, opset=15, name=f"s{_start}_e{_end}")
case("Size", _x)
case("Size", np.array(3.0, np.float32), name="scalar")
case("ConstantOfShape", i64(2, 3), opset=9, name="default")
case("ConstantOfShape", i64(2, 3), attrs={"value": value_tensor(1.5, np.float32)}, name="float")
case("ConstantOfShape", i64(3), attrs={"value": value_tensor(7, np.int64)}, name="int64")
case("ConstantOfShape", i64(2, 2), attrs={"value": value_tensor(True, np.bool_)}, name="bool")
case("ConstantOfShape", i64(2, 2), attrs={"value": value_tensor(3, np.int32)}, name="int32")
case("ConstantOfShape", np.zeros(0, np.int64), attrs={"value": value_tensor(2.0, np.float32)}, name="scalar")
case("Range", scalar(0), scalar(7), scalar(2), name="int")
case("Range", scalar(10), scalar(1), scalar(-3), name="int_down")
case("Range", scalar(3), scalar(3), scalar(1), name="empty")
case("Range", scalar(5), scalar(1), scalar(1), name="empty_backwards")
case("Range", scalar(0.5, np.float32), scalar(2.0, np.float32), scalar(0.25, np.float32), name="float")
case("Range", scalar(1.0, np.float32), scalar(-1.0, np.float32), scalar(-0.3, np.float32), name="float_down")
case("Range", scalar(2, np.int32), scalar(9, np.int32), scalar(3, np.int32), name="int32")

# -- reshaping -----------------------------------------------------------------------------------
_x = f(2, 3, 4)
for _name, _shape in {"flat": (-1,), "copy0": (0, -1), "copy0_mid": (0, 0, 2, 2), "two": (6, 4), "infer": (2, -1, 2),
                      "add_dims": (1, 2, 1, 12)}.items():
    case("Reshape", _x, i64(*_shape), name=_name)
case("Reshape", _x, i64(2, 12), opset=13, name="op13")
case("Reshape", _x, i64(4, 6), attrs={"allowzero": 1}, opset=14, name="allowzero")
case("Reshape", np.zeros((0, 3), np.float32), i64(3, 0), attrs={"allowzero": 1}, opset=14, name="allowzero_empty")
case("Reshape", ints(2, 6), i64(3, 4), name="int")
for _axis in (0, 1, 2, 3, -1, -3):
    case("Flatten", _x, attrs={"axis": _axis}, name=f"axis{_axis}")
case("Flatten", _x, opset=11, name="default")
_x = f(1, 3, 1, 4)
case("Squeeze", _x, attrs={"axes": [0, -2]}, opset=11, name="attr")
case("Squeeze", _x, opset=11, name="attr_none")
case("Squeeze", _x, i64(2, 0), opset=13, name="input")
case("Squeeze", _x, i64(-4), opset=13, name="input_neg")
case("Squeeze", _x, opset=13, name="none")
case("Squeeze", _x, np.zeros(0, np.int64), opset=13, name="empty_axes")
case("Squeeze", np.ones((1, 1), np.float32), opset=13, name="to_scalar")
_x = f(3, 4)
case("Unsqueeze", _x, attrs={"axes": [0, 3]}, opset=11, name="attr")
case("Unsqueeze", _x, attrs={"axes": [-1]}, opset=11, name="attr_neg")
case("Unsqueeze", _x, i64(3, 0), opset=13, name="unsorted")
case("Unsqueeze", _x, i64(1, -1), opset=13, name="neg")
case("Unsqueeze", _x, i64(-5, 1, -2), opset=13, name="three")
case("Unsqueeze", np.array(2.0, np.float32), i64(0), opset=13, name="scalar")
case("Unsqueeze", ints(3), i64(0), opset=13, name="int")
_x = f(2, 3, 4)
case("Transpose", _x, name="default")
case("Transpose", _x, attrs={"perm": [1, 2, 0]}, name="perm")
case("Transpose", f(2, 3, 4, 5), attrs={"perm": [0, 2, 1, 3]}, name="heads")
case("Transpose", ints(3, 4), attrs={"perm": [1, 0]}, name="int")

# -- joining and splitting -------------------------------------------------------------------------
case("Concat", f(2, 3), f(2, 1), f(2, 4), attrs={"axis": -1}, name="neg_axis")
case("Concat", f(2, 3), f(1, 3), attrs={"axis": 0}, name="axis0")
case("Concat", f(2, 3, 4), f(2, 2, 4), attrs={"axis": 1}, opset=11, name="op11")
case("Concat", f(2, 3), attrs={"axis": 1}, name="single")
case("Concat", i64(1, 2), i64(3), i64(4, 5), attrs={"axis": 0}, name="shape_like")
case("Concat", f(2, 3), np.zeros((2, 0), np.float32), attrs={"axis": 1}, name="empty_piece")
_x = f(2, 6, 3)
case("Split", _x, attrs={"axis": 1, "split": [1, 2, 3]}, n_outputs=3, opset=11, name="attr")
case("Split", _x, attrs={"axis": 1}, n_outputs=3, opset=11, name="equal")
case("Split", _x, i64(4, 2), attrs={"axis": 1}, n_outputs=2, opset=13, name="input")
case("Split", _x, attrs={"axis": -2}, n_outputs=2, opset=13, name="equal_neg")
case("Split", _x, i64(2, 2, 2), attrs={"axis": 1}, n_outputs=3, opset=18, name="input")
case("Split", _x, attrs={"axis": 1, "num_outputs": 3}, n_outputs=3, opset=18, name="num_outputs")
case("Split", f(7, 2), attrs={"num_outputs": 3}, n_outputs=3, opset=18, name="uneven")
case("Split", f(5, 2), attrs={"num_outputs": 2}, n_outputs=2, opset=18, name="uneven2")
case("Split", f(2, 3), attrs={"axis": 0}, n_outputs=1, opset=13, name="one")

# -- slicing ---------------------------------------------------------------------------------------------
_x = f(5, 6, 4)
case("Slice", _x, attrs={"starts": [1, 0], "ends": [4, 3], "axes": [0, 2]}, opset=9, name="attrs")
case("Slice", _x, attrs={"starts": [-2], "ends": [INT64_MAX]}, opset=9, name="attrs_noaxes")
_SLICES = {
    "basic": ((1,), (4,), None, None),
    "axes": ((1, 0), (4, 3), (0, 2), None),
    "neg_axes": ((1,), (-1,), (-2,), None),
    "neg_start": ((-3,), (100,), (1,), None),
    "clamped": ((-100, 2), (100, 1000), (0, 1), None),
    "int64_bounds": ((0,), (INT64_MAX,), (1,), (1,)),
    "step2": ((0, 1), (6, 6), (1, 2), (2, 2)),
    "step3": ((1,), (INT64_MAX,), (1,), (3,)),
    "reverse": ((-1,), (INT64_MIN,), (1,), (-1,)),
    "reverse_all": ((INT64_MAX,), (-INT64_MAX,), (0,), (-1,)),
    "neg_step2": ((5,), (0,), (1,), (-2,)),
    "neg_step_clamp_start": ((100,), (1,), (1,), (-2,)),
    "neg_step_low_start": ((-100,), (-200,), (1,), (-1,)),
    "neg_step_zero_start": ((0,), (-100,), (1,), (-1,)),
    "neg_step_end_neg1": ((3,), (-1,), (1,), (-1,)),
    "empty": ((4,), (2,), (1,), None),
    "empty_neg": ((1,), (4,), (1,), (-1,)),
    "mixed": ((4, 0), (0, 4), (0, 2), (-1, 3)),
}
for _name, (_s, _e, _axes, _steps) in _SLICES.items():
    _ins = [_x, i64(*_s), i64(*_e), None if _axes is None else i64(*_axes), None if _steps is None else i64(*_steps)]
    while _ins[-1] is None:
        _ins.pop()
    case("Slice", *_ins, name=_name)
case("Slice", _x, i64(1), i64(3), None, i64(2), name="steps_no_axes")
case("Slice", _x, i64(0, 1), i64(2, 5), i64(0, 1), opset=10, name="op10")
case("Slice", i64(2, 3, 4, 5), i64(-2), i64(INT64_MAX), i64(0), name="shape_like")

# -- gathers -----------------------------------------------------------------------------------------------
_table = f(6, 4)
case("Gather", _table, i64(0, 5, 2, 2), name="rows")
case("Gather", _table, i64(-1, -6, 3), name="neg")
case("Gather", _table, np.array([[0, 1], [5, 4]], np.int64), name="2d_indices")
case("Gather", _table, scalar(3), name="scalar_index")
case("Gather", _table, scalar(-2), name="scalar_neg")
case("Gather", _table, i64(1, -1, 0), attrs={"axis": 1}, name="axis1")
case("Gather", f(2, 3, 4), scalar(1), attrs={"axis": 1}, name="axis1_scalar")
case("Gather", f(2, 3, 4), np.array([[0, -1], [2, 1]], np.int64), attrs={"axis": -1}, name="axis_neg_2d")
case("Gather", _table, np.array([1, 3], np.int32), name="int32")
case("Gather", f(2, 3, 4), np.array([[1], [0]], np.int32), attrs={"axis": 1}, name="int32_axis1")
case("Gather", i64(2, 8, 32), scalar(1), name="shape_like")
case("Gather", _table, i64(0, 1), opset=11, name="op11")
_data = f(3, 4)
case("GatherElements", _data, np.array([[0, 1, 2, 0], [2, 2, 1, 0]], np.int64), name="axis0")
case("GatherElements", _data, np.array([[3, 0], [1, 1], [-1, -4]], np.int64), attrs={"axis": 1}, name="axis1_neg")
case("GatherElements", f(2, 3, 4), ints(2, 3, 2, lo=-4, hi=4), attrs={"axis": -1}, name="3d")
case("GatherElements", _data, np.array([[0, 1], [2, 0]], np.int32), name="int32")
_data = f(2, 3, 4)
case("GatherND", _data, np.array([[0, 1], [1, 2]], np.int64), name="k2")
case("GatherND", _data, np.array([[1], [0]], np.int64), name="k1")
case("GatherND", _data, np.array([[0, 1, 2], [1, -1, -4]], np.int64), name="k3_neg")
case("GatherND", _data, np.array([[[0, 0]], [[1, 2]]], np.int64), name="batched_idx")
case("GatherND", _data, np.array([[1], [2]], np.int64), attrs={"batch_dims": 1}, name="batch1_k1")
case("GatherND", _data, np.array([[[1, 3], [0, 0]], [[2, -1], [1, 2]]], np.int64), attrs={"batch_dims": 1},
     name="batch1_k2")
case("GatherND", f(2, 3, 4, 5), np.array([[[1], [2], [0]], [[0], [3], [-1]]], np.int64), attrs={"batch_dims": 2},
     name="batch2")
case("GatherND", _data, np.array([[0, 1], [1, 2]], np.int64), opset=11, name="op11")

# -- broadcasting copies, pads, triangles ---------------------------------------------------------------
_x = f(3, 1)
for _name, _shape in {"same_rank": (3, 4), "lower_rank": (4,), "ones": (1, 1), "higher_rank": (2, 3, 5),
                      "keeps_bigger": (1, 1, 1)}.items():
    case("Expand", _x, i64(*_shape), name=_name)
case("Expand", f(2, 1, 4), i64(3, 1), name="bidirectional")
case("Expand", i64(5, 6), i64(2, 1, 1), name="int")
case("Expand", f(3, 1), i64(3, 4), opset=8, name="op8")
case("Tile", f(2, 3), i64(2, 3))
case("Tile", f(2, 3, 4), i64(1, 2, 1), name="3d")
case("Tile", f(2, 3), i64(1, 1), name="ones")
case("Tile", ints(3), i64(2), name="int")
case("Tile", f(2, 3), i64(2, 1), opset=6, name="op6")
_x = f(3, 4)
case("Pad", _x, attrs={"pads": [1, 0, 2, 1], "value": 1.5}, opset=2, name="attrs")
case("Pad", _x, attrs={"pads": [1, 2, 0, 1], "mode": "edge"}, opset=2, name="attrs_edge")
case("Pad", _x, i64(1, 0, 2, 1), opset=11, name="default_value")
case("Pad", _x, i64(1, 0, 2, 1), np.array(-2.0, np.float32), opset=11, name="value")
case("Pad", _x, i64(0, 1, 0, 2), np.array(0.5, np.float32), opset=18, name="value18")
case("Pad", _x, i64(-1, 1, 0, -2), opset=11, name="negative")
case("Pad", _x, i64(2, 1), np.array(3.0, np.float32), i64(1), opset=18, name="axes")
case("Pad", _x, i64(1, 2), None, i64(-2), opset=18, name="axes_neg_no_value")
case("Pad", f(2, 3, 4), i64(0, 1, 2, 0, 2, 1), opset=13, name="3d")
for _mode in ("reflect", "edge"):
    case("Pad", _x, i64(1, 2, 2, 1), attrs={"mode": _mode}, opset=13, name=_mode)
    case("Pad", f(2, 3, 4), i64(0, 1, 2, 0, 1, 3), attrs={"mode": _mode}, opset=13, name=f"{_mode}_3d")
    case("Pad", f(5,), i64(2, 3), attrs={"mode": _mode}, opset=13, name=f"{_mode}_1d")
    case("Pad", _x, i64(-1, 2, 1, -1), attrs={"mode": _mode}, opset=13, name=f"{_mode}_negative")
    case("Pad", _x, i64(2, 1), None, i64(-1), attrs={"mode": _mode}, opset=18, name=f"{_mode}_axes")
case("Pad", _x, i64(1, 2, 2, 1), attrs={"mode": "wrap"}, opset=19, name="wrap")
case("Pad", f(2, 3, 4), i64(0, 1, 3, 0, 2, 1), attrs={"mode": "wrap"}, opset=19, name="wrap_3d")
case("Pad", ints(3, 4), i64(1, 0, 0, 1), scalar(7), opset=13, name="int")
for _k in (None, 0, 1, -1, 3):
    _ins = [f(2, 4, 5)] + ([] if _k is None else [scalar(_k)])
    case("Trilu", *_ins, opset=14, name=f"upper_k{_k}")
    case("Trilu", *_ins, attrs={"upper": 0}, opset=14, name=f"lower_k{_k}")
case("Trilu", f(3, 3), scalar(1), attrs={"upper": 0}, opset=14, name="square")
case("Trilu", ints(3, 4), opset=14, name="int")

# -- scans, argmax, indices --------------------------------------------------------------------------------
_x = f(3, 4)
for _axis in (0, 1, -1):
    for _ex in (0, 1):
        for _rev in (0, 1):
            case("CumSum", _x, scalar(_axis), attrs={"exclusive": _ex, "reverse": _rev}, opset=14,
                 name=f"a{_axis}_ex{_ex}_rev{_rev}")
case("CumSum", ints(3, 4), scalar(1, np.int32), opset=14, name="int_axis32")
case("CumSum", f(2, 3, 4), scalar(1), attrs={"exclusive": 1}, opset=11, name="op11_3d")
_ties = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, 2.0], [-1.0, -1.0, -1.0, -1.0]], np.float32)
for _op in ("ArgMax", "ArgMin"):
    for _axis in (0, 1, -1):
        for _keep in (0, 1):
            case(_op, _ties, attrs={"axis": _axis, "keepdims": _keep}, opset=13, name=f"a{_axis}_k{_keep}")
            case(_op, _ties, attrs={"axis": _axis, "keepdims": _keep, "select_last_index": 1}, opset=13,
                 name=f"a{_axis}_k{_keep}_last")
    case(_op, distinct(2, 3, 4), opset=11, name="default")
    case(_op, ints(3, 4), attrs={"axis": 1}, opset=13, name="int")
case("NonZero", np.array([[1.0, 0.0, 2.0], [0.0, 0.0, -1.0]], np.float32))
case("NonZero", bools(2, 3, 4), name="bool")
case("NonZero", ints(5, lo=-1, hi=2), name="int")
case("NonZero", np.zeros((2, 2), np.float32), name="none")
_idx = np.array([[0, 2, -1], [1, -3, 3]], np.int64)
_depth = scalar(4)
case("OneHot", _idx, _depth, np.array([0.0, 1.0], np.float32), name="default")
case("OneHot", _idx, _depth, np.array([-1.5, 2.0], np.float32), attrs={"axis": 0}, name="axis0")
case("OneHot", _idx, _depth, np.array([0, 5], np.int64), attrs={"axis": 1}, name="axis1_int")
case("OneHot", _idx, _depth, np.array([0.0, 1.0], np.float32), attrs={"axis": -2}, name="axis_neg2")
case("OneHot", _idx, np.array([4.0], np.float32), np.array([0.0, 1.0], np.float32), name="float_depth")
case("OneHot", _idx.astype(np.float32), _depth, np.array([0.0, 1.0], np.float32), name="float_indices")
case("OneHot", np.array([0, 4, -5, 2], np.int64), _depth, np.array([0.0, 1.0], np.float32), name="out_of_range")
_data = f(4, 3)
case("ScatterND", _data, np.array([[1], [3]], np.int64), f(2, 3), name="rows")
case("ScatterND", _data, np.array([[0, 1], [3, 2], [-1, 0]], np.int64), f(3), name="elements_neg")
case("ScatterND", f(2, 3, 4), np.array([[[0, 1]], [[1, 2]]], np.int64), f(2, 1, 4), name="batched")
for _red, _opset in (("add", 16), ("mul", 16), ("max", 18), ("min", 18)):
    case("ScatterND", _data, np.array([[1], [3], [1]], np.int64), f(3, 3), attrs={"reduction": _red}, opset=_opset,
         name=_red)
case("ScatterND", ints(4, 3), np.array([[2, 1]], np.int64), i64(9), opset=13, name="int")
_rows = np.array([[1, 0, 2, 1], [1, 0, 2, 0]], np.int64)
case("ScatterElements", f(3, 4), np.array([[1, 0, 3], [-1, 2, 0]], np.int64), f(2, 3), attrs={"axis": 1}, name="axis1")
case("ScatterElements", f(3, 4), _rows, f(2, 4), name="axis0")
for _red, _opset in (("add", 16), ("mul", 16), ("max", 18), ("min", 18)):
    case("ScatterElements", f(3, 4), _rows, f(2, 4), attrs={"reduction": _red}, opset=_opset, name=_red)
case("ScatterElements", ints(2, 5), np.array([[0, 4]], np.int64), ints(1, 2), attrs={"axis": 1}, opset=13, name="int")
_x = distinct(3, 5)
case("TopK", _x, i64(2), n_outputs=2, opset=11, name="default")
case("TopK", _x, i64(3), attrs={"largest": 0}, n_outputs=2, opset=11, name="smallest")
case("TopK", _x, i64(2), attrs={"axis": 0}, n_outputs=2, opset=11, name="axis0")
case("TopK", distinct(2, 3, 4), i64(4), attrs={"axis": -1, "sorted": 1}, n_outputs=2, opset=18, name="3d")
case("TopK", _x, i64(5), n_outputs=2, opset=10, name="op10")
case("TopK", ints(3, 5, lo=-100, hi=100) * 0 + np.arange(15).reshape(3, 5)[:, ::-1], i64(2), n_outputs=2, name="int")


# -- vision: convolution, pooling, batch normalisation ------------------------------------------
case("Conv", f(1, 2, 7), f(3, 2, 3), f(3), name="1d")
case("Conv", f(2, 3, 6, 5), f(4, 3, 3, 3), f(4), attrs={"pads": [1, 1, 1, 1], "strides": [2, 1]}, name="2d_pad_stride")
case("Conv", f(1, 4, 7, 7), f(6, 2, 3, 2), attrs={"group": 2, "dilations": [2, 1], "pads": [0, 1, 2, 0]},
     name="2d_groups_dilated_asym")
case("Conv", f(1, 2, 7, 6), f(3, 2, 3, 3), attrs={"auto_pad": "SAME_UPPER", "strides": [2, 2]}, name="same_upper")
case("Conv", f(1, 2, 7, 6), f(3, 2, 2, 3), attrs={"auto_pad": "SAME_LOWER"}, name="same_lower")
case("Conv", f(1, 2, 4, 5, 4), f(2, 2, 2, 3, 2), f(2), attrs={"strides": [1, 2, 1]}, name="3d")
case("ConvTranspose", f(1, 3, 4, 5), f(3, 2, 3, 3), f(2), attrs={"strides": [2, 2], "pads": [1, 0, 1, 0]}, name="2d")
case("ConvTranspose", f(1, 4, 5), f(4, 1, 3), attrs={"group": 2, "strides": [2], "output_padding": [1]}, name="1d_groups")
case("AveragePool", f(1, 2, 6, 7), attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, name="pad")
case("AveragePool", f(1, 2, 6, 7), attrs={"kernel_shape": [3, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
     name="include_pad")
case("AveragePool", f(1, 2, 7), attrs={"kernel_shape": [2], "strides": [2], "ceil_mode": 1}, name="1d_ceil")
case("MaxPool", f(1, 2, 7, 7), attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, name="resnet")
case("MaxPool", f(1, 2, 6, 6), attrs={"kernel_shape": [2, 2], "strides": [2, 2]}, name="vgg")
case("MaxPool", f(1, 2, 7, 6), attrs={"kernel_shape": [3, 2], "dilations": [2, 1], "pads": [0, 0, 1, 1]}, name="asym")
case("GlobalAveragePool", f(2, 3, 4, 5))
case("GlobalMaxPool", f(2, 3, 4, 5))
case("BatchNormalization", f(2, 3, 4, 5), f(3), f(3), f(3), np.abs(f(3)) + 0.5, name="2d")
case("BatchNormalization", f(2, 3, 4), f(3), f(3), f(3), np.abs(f(3)) + 0.5, attrs={"epsilon": 1e-3}, name="1d")
case("HardSigmoid", f(3, 4) * 4)
case("HardSigmoid", f(3, 4) * 4, attrs={"alpha": 0.3, "beta": 0.4}, name="params")
case("HardSwish", f(3, 4) * 4)


_img = f(1, 2, 4, 5)
# float64 runs would make `scales` double, which Resize refuses: float32 only
case("Resize", _img, None, np.array([1, 1, 2, 2], np.float32),
     attrs={"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
     name="nearest_upsample", f64=False)
case("Resize", _img, None, np.array([1, 1, 1.5, 0.6], np.float32), attrs={"mode": "nearest"}, name="nearest_half_pixel", f64=False)
case("Resize", _img, None, np.array([1, 1, 2, 2], np.float32), attrs={"mode": "linear"}, name="linear_half_pixel", f64=False)
case("Resize", _img, None, np.array([1, 1, 0.5, 0.6], np.float32),
     attrs={"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, name="linear_down", f64=False)
case("Resize", _img, None, None, np.array([1, 2, 7, 3], np.int64),
     attrs={"mode": "linear", "coordinate_transformation_mode": "align_corners"}, name="linear_sizes_corners", f64=False)
case("Resize", _img, None, None, np.array([1, 2, 6, 9], np.int64),
     attrs={"mode": "nearest", "coordinate_transformation_mode": "tf_half_pixel_for_nn", "nearest_mode": "ceil"},
     name="nearest_sizes_ceil", f64=False)

# cubic (DINOv2 interpolates its position embeddings bicubically: pytorch_half_pixel, a = −0.75), opsets 11–19
for _opset in (11, 13, 18, 19):
    case("Resize", _img, np.array([], np.float32), np.array([1, 1, 1.75, 0.6], np.float32),
         attrs={"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, opset=_opset,
         name="cubic_pytorch", f64=False)
case("Resize", _img, None, np.array([1, 1, 2, 2], np.float32), attrs={"mode": "cubic"}, name="cubic_half_pixel", f64=False)
case("Resize", _img, None, np.array([1, 1, 2.5, 1.5], np.float32),
     attrs={"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, name="cubic_exclude_outside", f64=False)
case("Resize", _img, None, None, np.array([1, 2, 7, 3], np.int64),
     attrs={"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, name="cubic_sizes_corners", f64=False)
case("Resize", _img, None, None, np.array([1, 2, 3, 8], np.int64),
     attrs={"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, name="cubic_asymmetric", f64=False)
# opset 18: scales / sizes for some axes, and the aspect-ratio policies
case("Resize", _img, None, np.array([2, 1.5], np.float32), attrs={"mode": "cubic", "axes": [2, 3]},
     opset=18, name="cubic_axes", f64=False)
for _policy in ("not_larger", "not_smaller"):
    case("Resize", _img, None, None, np.array([7, 7], np.int64),
         attrs={"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": _policy}, opset=18,
         name=f"linear_{_policy}", f64=False)

# XLNet's relative attention: an identity matrix shaped like its input
case("EyeLike", f(3, 4), name="float")
case("EyeLike", f(4, 3), attrs={"k": 1, "dtype": TensorProto.INT64}, name="k1_int")
case("EyeLike", f(3, 5), attrs={"k": -2}, name="k_neg")
case("EyeLike", ints(2, 2), attrs={"dtype": TensorProto.FLOAT}, name="from_int")

# onnxruntime's quantize_dynamic stores a quantized embedding table behind DequantizeLinear
_q = RNG.integers(0, 255, (4, 3)).astype(np.uint8)
case("DequantizeLinear", _q, np.array(0.05, np.float32), np.array(128, np.uint8), name="tensor", opset=13, f64=False)
case("DequantizeLinear", _q.astype(np.int8), np.array([0.1, 0.2, 0.3], np.float32),
     np.array([1, -2, 3], np.int8), attrs={"axis": 1}, name="per_axis", opset=13, f64=False)
case("DequantizeLinear", RNG.integers(-9, 9, (4, 3)).astype(np.int8), np.array([0.5, 0.25, 2.0, 1.0], np.float32),
     attrs={"axis": 0}, name="axis0_no_zero_point", opset=19, f64=False)
case("DequantizeLinear", RNG.integers(-99, 99, (3, 4)).astype(np.int32), np.array(0.01, np.float32), name="int32",
     opset=13, f64=False)  # the ONNX schema takes float scales only (no double)

# -- quantization (onnxruntime's quantize_dynamic / quantize_static emit these) -----------------------------
_s = np.array(0.05, np.float32)
case("QuantizeLinear", f(3, 4) * 4, _s, np.array(128, np.uint8), name="uint8", f64=False)
case("QuantizeLinear", f(3, 4) * 4, _s, np.array(-3, np.int8), name="int8_saturating", f64=False)
case("QuantizeLinear", f(3, 4), _s, name="no_zero_point", f64=False)
case("QuantizeLinear", f(2, 3, 4), np.array([0.01, 0.02, 0.05], np.float32), np.array([0, 5, -5], np.int8),
     attrs={"axis": 1}, name="per_axis", f64=False, opset=13)
case("QuantizeLinear", np.array([0.025, 0.075, -0.025, 0.125], np.float32), _s, np.array(0, np.int8),
     name="half_to_even", f64=False)
case("DynamicQuantizeLinear", f(3, 5) * 3, n_outputs=3, opset=11, f64=False)
case("DynamicQuantizeLinear", np.abs(f(4, 2)) + 0.5, n_outputs=3, opset=11, name="positive", f64=False)
case("MatMulInteger", ints(3, 4, lo=0, hi=256, dtype=np.uint8), ints(4, 5, lo=-128, hi=128, dtype=np.int8),
     np.array(131, np.uint8), np.array(0, np.int8), opset=10, name="u8s8")
case("MatMulInteger", ints(2, 3, 4, lo=0, hi=256, dtype=np.uint8), ints(4, 5, lo=0, hi=256, dtype=np.uint8),
     np.array(7, np.uint8), np.array([1, 2, 3, 4, 5], np.uint8), opset=10, name="u8u8_per_column")
case("MatMulInteger", ints(3, 4, lo=0, hi=256, dtype=np.uint8), ints(4, 5, lo=-128, hi=128, dtype=np.int8),
     opset=10, name="no_zero_points")
case("ConvInteger", ints(1, 2, 6, 5, lo=0, hi=256, dtype=np.uint8), ints(3, 2, 3, 3, lo=0, hi=256, dtype=np.uint8),
     np.array(120, np.uint8), np.array(3, np.uint8), attrs={"pads": [1, 1, 1, 1], "strides": [2, 1]}, opset=10)
case("ConvInteger", ints(1, 2, 7, lo=0, hi=256, dtype=np.uint8), ints(3, 2, 3, lo=0, hi=256, dtype=np.uint8),
     opset=10, name="1d_no_zero_points")

OPS_COVERED = {c.op for c in CASES} | SEQUENCE_OPS | RECURRENT_OPS


def _params(cases, *, f64: bool = False):
    out = []
    for c in cases:
        layouts = c.valid_layouts()[:1] if f64 else c.valid_layouts()
        for layout in layouts:
            out.append(pytest.param(c, layout, id=f"{c.id}-{layout}"))
    return out


def _has_float(c: Case) -> bool:
    return c.f64 and (any(x is not None and x.dtype.kind == "f" for x in c.inputs) or any(
        getattr(v, "data_type", None) == TensorProto.FLOAT for v in c.attrs.values()))


def test_every_registered_op_has_a_case():
    """Every ONNX op (rulegraph's own, which onnxruntime cannot run, are compared with the ONNX
    subgraphs they stand for in tests/ops/test_rulegraph_ops.py)."""
    missing = sorted({name for (domain, name) in REGISTRY if not domain} - OPS_COVERED)
    assert not missing, f"ops registered without an onnxruntime test case: {missing}"


@pytest.mark.parametrize("c, layout", _params(CASES))
def test_against_onnxruntime(c: Case, layout: str):
    check_case(c, layout)


@pytest.mark.parametrize("c, layout", _params([c for c in CASES if _has_float(c)], f64=True))
def test_float64_against_onnxruntime(c: Case, layout: str):
    check_case_f64(c, layout)


@pytest.mark.parametrize("op, first, second", [
    ("Reshape", [i64(6, 4)], [i64(4, -1)]),
    ("Slice", [i64(1), i64(3), i64(0), i64(1)], [i64(-1), i64(INT64_MIN), i64(0), i64(-1)]),
    ("Unsqueeze", [i64(0)], [i64(-1)]),
])
def test_static_graph_inputs_are_read_every_run(op, first, second):
    """A static argument (shape, starts…) fed as a graph input changes between runs of one plan."""
    import rulegraph
    import torch

    from .onnx_harness import build, run_ort

    x = f(2, 3, 4)
    graph = None
    for extra in (first, second, first):
        c = Case(op, [x, *extra], opset=18)
        model, feeds = build(c, "inputs")
        ref = run_ort(model, feeds)[0]
        if graph is None:  # the same graph (and plan) for every run
            graph = rulegraph.load(model)
        got = rulegraph.run(graph, {k: torch.from_numpy(v) for k, v in feeds.items()})[graph.outputs[0]]
        np.testing.assert_array_equal(got.numpy(), ref)
