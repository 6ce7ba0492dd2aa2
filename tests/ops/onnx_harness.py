"""Build one-node ONNX models and run them through onnxruntime and rulegraph.

A :class:`Case` is one node: op type, input arrays (``None`` for an omitted optional
input), ONNX attributes and opset. :func:`build` turns it into a ModelProto in one of
three *layouts* — which inputs are graph inputs and which are initializers:

``inputs``  every present input is a graph input (nothing is constant-folded);
``data``    input 0 is a graph input, the rest are initializers (the usual export shape:
            data flowing in, shapes/axes/weights fixed);
``const``   every input is an initializer, so rulegraph folds the node at prepare time.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

_TO_TORCH = {
    np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64, np.dtype(np.float16): torch.float16,
    np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32, np.dtype(np.int16): torch.int16,
    np.dtype(np.int8): torch.int8, np.dtype(np.uint8): torch.uint8, np.dtype(np.bool_): torch.bool,
}


@dataclass
class Case:
    op: str
    inputs: Sequence[np.ndarray | None]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 18
    n_outputs: int = 1
    domain: str = ""
    name: str = ""
    layouts: tuple[str, ...] | None = None     # None: every layout that differs for this case
    rtol: float = 1e-5
    atol: float = 1e-6
    check: bool = True                          # run onnx.checker (off for ORT-internal ops)
    f64: bool = True                            # also run the float64 comparison
    f64_rtol: float = 1e-9                      # against onnxruntime's double kernels
    f64_atol: float = 1e-12

    @property
    def id(self) -> str:
        return f"{self.op}-{self.name}-op{self.opset}" if self.name else f"{self.op}-op{self.opset}"

    def present(self) -> list[int]:
        return [i for i, x in enumerate(self.inputs) if x is not None]

    def valid_layouts(self) -> list[str]:
        if self.layouts is not None:
            return list(self.layouts)
        present = self.present()
        out = ["inputs"]
        if len(present) > 1:
            out.append("data")
        if present:
            out.append("const")
        return out


def _as_double(case: Case) -> Case:
    """The same node with every float32 input, float tensor attribute and Cast target made double."""
    inputs = [x.astype(np.float64) if x is not None and x.dtype == np.float32 else x for x in case.inputs]
    attrs = dict(case.attrs)
    for k, v in attrs.items():
        if isinstance(v, TensorProto) and v.data_type == TensorProto.FLOAT:
            attrs[k] = numpy_helper.from_array(numpy_helper.to_array(v).astype(np.float64), v.name)
    if case.op == "Cast" and attrs.get("to") == TensorProto.FLOAT:
        attrs["to"] = TensorProto.DOUBLE
    return dataclasses.replace(case, inputs=inputs, attrs=attrs)


def build(case: Case, layout: str = "inputs") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The one-node model for ``case`` in ``layout`` and its feeds."""
    names, graph_inputs, inits, feeds = [], [], [], {}
    for i, x in enumerate(case.inputs):
        if x is None:
            names.append("")
            continue
        name = f"x{i}"
        names.append(name)
        as_input = layout == "inputs" or (layout == "data" and i == case.present()[0])
        if as_input:
            graph_inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape)))
            feeds[name] = x
        else:
            inits.append(numpy_helper.from_array(x, name))
    outputs = [f"y{k}" for k in range(case.n_outputs)]
    node = helper.make_node(case.op, names, outputs, domain=case.domain or None, **case.attrs)
    graph = helper.make_graph([node], "one_node", graph_inputs,
                              [helper.make_empty_tensor_value_info(o) for o in outputs], initializer=inits)
    opsets = [helper.make_opsetid("", case.opset)]
    if case.domain:
        opsets.append(helper.make_opsetid(case.domain, 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=min(onnx.IR_VERSION, 10))
    if case.check:  # validate the test's own node against the ONNX schema, and type the outputs
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        for out in model.graph.output:  # a data-dependent output shape is left out of the type
            if out.type.HasField("tensor_type") and not out.type.tensor_type.HasField("shape"):
                out.ClearField("type")
        if all(out.HasField("type") for out in model.graph.output):
            onnx.checker.check_model(model)
    return model, feeds


_SKIPPABLE = ("NOT_IMPLEMENTED", "Could not find an implementation", "is not a registered function/op",
              "No Op registered", "not supported", "Unsupported")


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs; skips the test where ORT lacks the op / type / opset."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        message = str(exc)
        if any(s in message for s in _SKIPPABLE):
            pytest.skip(f"onnxruntime {ort.__version__} has no kernel: {message.splitlines()[0][:200]}")
        raise
    return session.run(None, feeds)


def ort_supports(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """Like :func:`run_ort` but returns ``None`` instead of skipping."""
    try:
        return run_ort(model, feeds)
    except pytest.skip.Exception:
        return None


def run_rulegraph(model: onnx.ModelProto, feeds: dict[str, np.ndarray], dtype=torch.float32) -> list[torch.Tensor]:
    import rulegraph
    graph = rulegraph.load(model)
    out = rulegraph.run(graph, {k: torch.from_numpy(np.array(v)) for k, v in feeds.items()}, dtype=dtype)
    return [out[o] for o in graph.outputs]


def assert_same(got: torch.Tensor, ref: np.ndarray, *, rtol: float, atol: float, float_dtype: torch.dtype,
                what: str = "") -> None:
    """``got`` matches ``ref``: floats within tolerance (in ``float_dtype``), everything else exactly."""
    ref = np.asarray(ref)
    assert isinstance(got, torch.Tensor), f"{what}: rulegraph returned {type(got).__name__}"
    assert tuple(got.shape) == ref.shape, f"{what}: shape {tuple(got.shape)} != onnxruntime's {ref.shape}"
    if ref.dtype.kind == "f":
        assert got.dtype == float_dtype, f"{what}: dtype {got.dtype}, expected {float_dtype} (ORT: {ref.dtype})"
        np.testing.assert_allclose(got.numpy().astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True, err_msg=what)
    else:
        assert got.dtype == _TO_TORCH[ref.dtype], f"{what}: dtype {got.dtype} != onnxruntime's {ref.dtype}"
        np.testing.assert_array_equal(got.numpy(), ref, err_msg=what)


def check_case(case: Case, layout: str) -> None:
    """rulegraph (float32) against onnxruntime on ``case`` in ``layout``."""
    model, feeds = build(case, layout)
    ref = run_ort(model, feeds)
    got = run_rulegraph(model, feeds)
    assert len(got) == len(ref)
    for k, (g, r) in enumerate(zip(got, ref)):
        assert_same(g, r, rtol=case.rtol, atol=case.atol, float_dtype=torch.float32,
                    what=f"{case.id}[{layout}] output {k}")


def check_case_f64(case: Case, layout: str = "inputs") -> None:
    """The float32 model run by rulegraph in float64 against a double reference.

    The reference is onnxruntime on the same node built in DOUBLE; where onnxruntime has
    no double kernel, it is the float32 run, compared at float32 tolerance.
    """
    model, feeds = build(case, layout)
    double = _as_double(case)
    dmodel, dfeeds = build(double, layout)
    ref = ort_supports(dmodel, dfeeds)
    if ref is None:
        ref = run_ort(model, feeds)
    got = run_rulegraph(model, dfeeds, dtype=torch.float64)
    assert len(got) == len(ref)
    for k, (g, r) in enumerate(zip(got, ref)):
        # an output onnxruntime keeps in float32 even in the double model (LayerNormalization's
        # statistics with stash_type=1) or the float32 fallback: compare at float32 tolerance
        if np.asarray(r).dtype == np.float64:
            rtol, atol = case.f64_rtol, case.f64_atol
        else:
            rtol, atol = max(case.rtol, 1e-5), max(case.atol, 1e-6)
        assert_same(g, r, rtol=rtol, atol=atol, float_dtype=torch.float64,
                    what=f"{case.id}[{layout}, float64] output {k}")
