"""onnxruntime sessions on the file a graph was loaded from, kept on the graph (:attr:`GraphCache.sessions`).

A session returns any value the file's nodes compute, not only its outputs: a value that is not one is
added to the outputs of the model the session loads (a final Softmax's logits, which rulegraph explains).
Used by the perturbation baselines' onnxruntime runtime (:mod:`rulegraph.methods.sequences`) and by the
rounding check of quantized graphs (:mod:`rulegraph.rounding`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .ir import Graph

#: onnxruntime's input types → numpy dtypes (token ids and masks are int64 or int32 in exports)
NUMPY = {"tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(float)": "float32", "tensor(double)": "float64",
         "tensor(float16)": "float16", "tensor(bool)": "bool"}


def onnx_file(graph: Graph) -> str | None:
    """The ONNX file the graph was loaded from, where it still exists."""
    path = graph.source.removeprefix("onnx:") if graph.source.startswith("onnx:") else None
    return path if path and Path(path).is_file() else None


def file_source(graph: Graph, output: str):
    """What onnxruntime loads to return ``output`` of the graph's file: the file's path where ``output`` is
    one of its outputs, else the model with ``output`` added to its outputs (serialized; a value the file's
    nodes compute), else None (no file, or a value the loader or a canonizer made). Decided once per graph
    and output."""
    key = ("source", output)
    sessions = graph.cache.sessions
    if key not in sessions:
        import onnx
        path = onnx_file(graph)
        proto = onnx.load(path, load_external_data=False) if path else None
        if proto is None:
            sessions[key] = None
        elif output in {o.name for o in proto.graph.output}:
            sessions[key] = path
        elif any(output in n.output for n in proto.graph.node):
            proto = onnx.load(path)
            proto.graph.output.append(onnx.ValueInfoProto(name=output))
            sessions[key] = proto.SerializeToString()
        else:
            sessions[key] = None
    return sessions[key]


def session(graph: Graph, output: str, *, name: str = "", source: str | bytes | None = None):
    """One onnxruntime session per graph, ``output``, thread count and ``name`` (a session that loads another
    ``source`` than the file: one name each), kept on the graph. ``output`` must be computed by the file
    (:func:`file_source` is not None)."""
    import onnxruntime as ort
    sessions = graph.cache.sessions
    key = (output, torch.get_num_threads(), name)
    if key not in sessions:
        options = ort.SessionOptions()
        options.intra_op_num_threads = key[1]
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")   # no busy cores between runs
        sessions[key] = ort.InferenceSession(source if source is not None else file_source(graph, output), options,
                                             providers=["CPUExecutionProvider"])
    return sessions[key]


def run(made, output: str, inputs: Mapping[str, Any]) -> np.ndarray:
    """``output`` of the session ``made`` for ``inputs`` (tensors or arrays, cast to the types it declares)."""
    feeds = {i.name: np.asarray(torch.as_tensor(inputs[i.name]).detach().cpu().numpy()).astype(NUMPY.get(i.type, "int64"))
             for i in made.get_inputs() if i.name in inputs}
    return made.run([output], feeds)[0]
