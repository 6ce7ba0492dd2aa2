"""ONNX ModelProto → IR.

Initializers and ``Constant`` nodes become constants; attributes become Python values
under their ONNX names (``Cast.to`` becomes a torch dtype). Opset differences that
change an op's meaning without changing its name are settled here, once, so the ops
see one convention: Softmax before opset 13 flattens to 2-D; Split learns its number
of outputs. Node scopes come from the dynamo exporter's ``name_scopes`` metadata or
from TorchScript-style names (``/bert/encoder/layer.0/attention/self/MatMul``).
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..errors import ModelError
from ..ir import Graph, Node, ValueInfo
from . import contrib
from .external import ExternalData

#: the opsets of the default ONNX domain rulegraph's ops are written and tested for (tests/ops: 2…23)
OPSETS = range(1, 24)

# TensorProto data type → torch dtype
DTYPES: dict[int, torch.dtype] = {
    onnx.TensorProto.FLOAT: torch.float32,
    onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.BFLOAT16: torch.bfloat16,
    onnx.TensorProto.INT64: torch.int64,
    onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT16: torch.int16,
    onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.BOOL: torch.bool,
}


def model_file(path: str | Path) -> Path:
    """The ONNX file ``path`` names: itself, or the one ``.onnx`` file of a folder."""
    path = Path(path)
    if not path.exists():
        hub = len(path.parts) <= 2 and not str(path).startswith((".", "/", "~")) and not path.suffix
        raise ModelError(f"model file not found: {path}" + (
            f" (a Hugging Face model name? rulegraph reads files: save the model with transformers' "
            f"save_pretrained(HF_FOLDER), then `rulegraph export HF_FOLDER OUT` and explain OUT/model.onnx)"
            if hub else ""))
    if path.is_dir():
        candidates = sorted(path.glob("*.onnx"))
        if not candidates and (path / "config.json").is_file():
            raise ModelError(f"{path} is a Hugging Face model folder, not an export: run `rulegraph export {path} OUT` "
                             "and explain OUT/model.onnx (or give the loaded model to rulegraph.explain in Python)")
        if len(candidates) != 1:
            raise ModelError(f"{path} is a directory with {len(candidates)} .onnx files; name the model file")
        path = candidates[0]
    return path


def _read(path: Path, external: ExternalData):
    """The model in ``path`` checked, and the file as read once (:class:`~rulegraph.loaders.onnx_file.OnnxFile`,
    whose buffer holds the initializers' ``raw_data``; ``None`` when ``onnx.load`` had to read it).
    External data is not read (:class:`~rulegraph.loaders.external.ExternalData` maps it when the graph
    is loaded), only its locations checked."""
    from . import onnx_file
    try:
        read = onnx_file.read(path)
        model = read.model if read is not None else onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types
        raise ModelError(f"{path} is not a readable ONNX model ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'truncated or corrupt'})") from None
    if not model.graph.node:
        raise ModelError(f"{path} holds no graph nodes; is it an ONNX model?")
    inits = model.graph.initializer
    for init in inits:
        if _is_external(init):
            external.tensor(init, *_element(init))          # every location checked before the checker reads them
    try:
        if read is None:
            onnx.checker.check_model(str(path))
        else:
            onnx_file.check(model, {k for k, init in enumerate(inits) if read.raw[k] is not None or _is_external(init)})
    except onnx.checker.ValidationError as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), "invalid")
        if "No Op registered" not in first:  # unknown ops are reported per node, later
            raise ModelError(f"{path} is not a valid ONNX model: {first}") from None
    return model, read


def load_onnx(model: onnx.ModelProto | str | Path) -> Graph:
    """Convert an ONNX model (or file) into the IR; initializers stored as external data are
    memory-mapped from the files beside the model (see :mod:`rulegraph.loaders.external`)."""
    source = "onnx"
    external = ExternalData(None)
    read = None
    if not isinstance(model, onnx.ModelProto):
        source = f"onnx:{model}"
        path = model_file(model)
        external = ExternalData(path)
        model, read = _read(path, external)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset and opset not in OPSETS:
        raise ModelError(f"{source.partition(':')[2] or 'the model'}: opset {opset} of the default ONNX domain is not "
                         f"one rulegraph knows ({OPSETS[0]}…{OPSETS[-1]}): its ops may mean something else there; "
                         "export with an opset in that range (e.g. rulegraph export --opset 18)")
    g = model.graph
    for n in g.node:
        for a in n.attribute:
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                raise ModelError(f"node {n.name or n.op_type!r} ({n.op_type}) has a subgraph; control flow is not supported")

    held: dict[int, torch.Tensor] = {}
    if read is not None:                    # the weights as views of the buffer the file was read into
        from .onnx_file import weights
        held = weights(read, {k: _element(g.initializer[k]) for k, found in enumerate(read.raw) if found is not None},
                       source.partition(":")[2])
    constants = {init.name: held[k] if k in held else _tensor(init, external) for k, init in enumerate(g.initializer)}
    for sparse in g.sparse_initializer:
        constants[sparse.values.name] = _dense(sparse, f"sparse initializer {sparse.values.name!r}")
    inputs = [_value_info(v) for v in g.input if v.name not in constants]

    nodes: list[Node] = []
    used: set[str] = set()
    shapes = contrib.Shapes(lambda: _shapes(model))
    for i, n in enumerate(g.node):
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            constants[n.output[0]] = _constant_value(n)
            continue
        name = _unique(n.name or f"{n.op_type}_{i}", used)
        attrs = {a.name: _attribute(a) for a in n.attribute}
        if contrib.expands(n.domain, n.op_type):
            for node in contrib.expand(name, n.op_type, tuple(n.input), tuple(n.output), attrs, _scope(n), constants,
                                       shapes):
                node.name = _unique(node.name, used)
                nodes.append(node)
            continue
        nodes.append(Node(
            name=name, op=n.op_type, inputs=tuple(n.input), outputs=tuple(n.output),
            attrs=_normalise(n.op_type, attrs, opset, len(n.output)), domain=n.domain,
            scope=_scope(n)))
    metadata = {p.key: p.value for p in model.metadata_props}
    return Graph(nodes, inputs, [o.name for o in g.output], constants, opset=opset,
                 name=g.name, metadata=metadata, source=source)


def _shapes(model: onnx.ModelProto) -> dict[str, tuple]:
    """The shapes of the model's values, by name, for the contrib expansions: from onnxruntime's
    symbolic shape inference (which knows its contrib ops), else onnx's (which stops at them), else
    the shapes the model declares."""
    graph = model.graph
    try:
        graph = _symbolic_shapes(model)
    except Exception:  # noqa: BLE001  (a graph it cannot follow: onnx's inference, then the declared shapes)
        try:
            graph = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # noqa: BLE001
            pass
    return {v.name: _value_info(v).shape for v in (*graph.value_info, *graph.input, *graph.output)
            if v.type.tensor_type.elem_type in DTYPES and v.type.tensor_type.HasField("shape")}


def _symbolic_shapes(model: onnx.ModelProto) -> onnx.GraphProto:
    """onnxruntime's symbolic shape inference, its steps taken here: its ``infer_shapes`` saves a graph it
    cannot follow to the file ``sym_shape_infer_temp.onnx`` in the working directory (a user's file of that
    name overwritten) before it raises. Raises ValueError where it cannot follow the graph."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference, get_opset
    if (get_opset(model) or 0) < 7:
        raise ValueError("symbolic shape inference needs opset 7 or later")
    inference = SymbolicShapeInference(2**31 - 1, True, True, 0)    # int_max, auto_merge, guess_output_rank
    inference._preprocess(model)
    complete = False
    while inference.run_:
        complete = inference._infer_impl()
    if not complete:
        raise ValueError("incomplete symbolic shape inference")
    inference._update_output_from_vi()
    return inference.out_mp_.graph


def _tensor(proto: onnx.TensorProto, external: ExternalData | None = None) -> torch.Tensor:
    """A tensor proto's values as a torch tensor (bfloat16 kept as such; external data mapped)."""
    dtype, itemsize = _element(proto)
    if _is_external(proto):
        return (external or ExternalData(None)).tensor(proto, dtype, itemsize)
    array = numpy_helper.to_array(proto)
    if dtype == torch.bfloat16:                 # numpy has no bfloat16: its bits, read as torch's
        return torch.from_numpy(np.array(array.view(np.uint16), copy=True)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array, copy=True))


def _is_external(proto: onnx.TensorProto) -> bool:
    return proto.HasField("data_location") and proto.data_location == onnx.TensorProto.EXTERNAL


def _element(proto: onnx.TensorProto) -> tuple[torch.dtype, int]:
    """The torch element type of a tensor proto and its size in bytes; an unsupported one is an error."""
    dtype = DTYPES.get(proto.data_type)
    if dtype is None:
        name = onnx.TensorProto.DataType.Name(proto.data_type) if proto.data_type in \
            onnx.TensorProto.DataType.values() else str(proto.data_type)
        what = "strings" if proto.data_type == onnx.TensorProto.STRING else f"{name} values"
        raise ModelError(f"initializer {proto.name!r} holds {what}; supported element types: "
                         f"{', '.join(sorted(onnx.TensorProto.DataType.Name(k) for k in DTYPES))}")
    return dtype, torch.empty((), dtype=dtype).element_size()


def _value_info(v: onnx.ValueInfoProto) -> ValueInfo:
    t = v.type.tensor_type
    dtype = DTYPES.get(t.elem_type)
    if dtype is None:
        raise ModelError(f"graph input {v.name!r} has element type {onnx.TensorProto.DataType.Name(t.elem_type)}, "
                         "which rulegraph does not support")
    shape = None
    if t.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return ValueInfo(v.name, dtype, shape)


def _attribute(a: onnx.AttributeProto):
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return _tensor(value)
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode() for v in value]
    return value


def _constant_value(n: onnx.NodeProto) -> torch.Tensor:
    a = n.attribute[0]
    value = _attribute(a)
    if a.name == "value":
        return value
    if a.name == "sparse_value":
        return _dense(a.sparse_tensor, f"Constant node {n.name!r}")
    if a.name in ("value_float", "value_floats"):
        return torch.tensor(value, dtype=torch.float32)
    if a.name in ("value_int", "value_ints"):
        return torch.tensor(value, dtype=torch.int64)
    raise ModelError(f"Constant node {n.name!r} holds a {a.name}, which rulegraph does not support")


def _dense(sparse: onnx.SparseTensorProto, what: str) -> torch.Tensor:
    """A sparse tensor made dense, refused before it is when the dense form is over the budget."""
    from ..limits import check_tensor
    itemsize = torch.empty((), dtype=DTYPES.get(sparse.values.data_type, torch.float64)).element_size()
    check_tensor(int(np.prod([max(int(d), 0) for d in sparse.dims], dtype=object)), itemsize, what)
    return torch.from_numpy(np.array(numpy_helper.to_array(sparse))).clone()


def _normalise(op: str, attrs: dict, opset: int, n_outputs: int) -> dict:
    """Settle opset-dependent conventions so each op implementation sees one."""
    if op == "Cast":
        attrs["to"] = _dtype(attrs["to"], op)
    elif op in ("Softmax", "LogSoftmax", "Hardmax") and opset < 13:
        attrs.setdefault("axis", 1)
        attrs["coerce_2d"] = 1
    elif op == "Split" and "split" not in attrs:
        attrs.setdefault("num_outputs", n_outputs)
    elif op == "ConstantOfShape" and "value" not in attrs:
        attrs["value"] = torch.zeros(1, dtype=torch.float32)
    elif op in ("EyeLike", "SequenceEmpty", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike") and "dtype" in attrs:
        attrs["dtype"] = _dtype(attrs["dtype"], op)
    return attrs


def _dtype(code: int, op: str) -> torch.dtype:
    if code not in DTYPES:
        raise ModelError(f"{op} to element type {onnx.TensorProto.DataType.Name(code)} is not supported")
    return DTYPES[code]


def _scope(n: onnx.NodeProto) -> str:
    for p in n.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                break
            modules = [s for s in scopes[:-1] if s and not s.startswith("_")]
            return modules[-1] if modules else ""
    if n.name.startswith("/"):
        return ".".join(part for part in n.name.strip("/").split("/")[:-1])
    return ""


def _unique(name: str, used: set[str]) -> str:
    base, k = name, 1
    while name in used:
        name = f"{base}__{k}"
        k += 1
    used.add(name)
    return name
