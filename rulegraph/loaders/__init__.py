"""Loaders: an exported model (ONNX file or ModelProto, torch.export program, fx GraphModule) or a
Hugging Face module in memory (captured with torch.export, once per module and weights) → IR."""
from __future__ import annotations

import json
import logging
import weakref
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..exporters.to_fx import FX_METADATA
from ..ir import Graph, Node
from .metadata import KEY, ExportInfo

#: Hugging Face modules captured so far: module → (its weights' versions, the graph)
_CAPTURED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def load(model: Any) -> Graph:
    """Load ``model`` into the IR.

    Accepts a path to an ``.onnx`` file (or a directory holding one), a ``.pt2`` file
    written by ``torch.export.save``, an ``onnx.ModelProto``, a
    ``torch.export.ExportedProgram``, a ``torch.fx.GraphModule`` produced by
    ``torch.export``, or a Hugging Face model in memory (``…ForSequenceClassification``,
    ``…ForCausalLM``…: captured with torch.export as ``rulegraph export`` would, with eager
    attention; kept until its weights change). A :class:`~rulegraph.ir.Graph` is returned unchanged.
    """
    if isinstance(model, Graph):
        return model
    from .metadata import check
    return check(_with_outputs(_load(model)))


def _with_outputs(graph: Graph) -> Graph:
    if not graph.outputs:
        raise ModelError(f"the model ({graph.source or graph.name or 'given'}) has no outputs: nothing to explain")
    return graph


def _load(model: Any) -> Graph:
    if isinstance(model, (str, Path)):
        if Path(model).suffix == ".pt2":
            return _load_pt2(Path(model))
        from .onnx import load_onnx
        return load_onnx(model)
    import onnx
    if isinstance(model, onnx.ModelProto):
        from .onnx import load_onnx
        return load_onnx(model)
    import torch
    if isinstance(model, (torch.export.ExportedProgram, torch.fx.GraphModule)):
        from .fx import load_fx
        return load_fx(model)
    if isinstance(model, torch.nn.Module) and hasattr(getattr(model, "config", None), "model_type"):
        return _load_hf_module(model)
    raise ModelError(f"cannot load a {type(model).__name__}; give an .onnx path, an onnx.ModelProto, "
                     "a torch.export.ExportedProgram, an fx GraphModule or a Hugging Face model")


def _load_hf_module(module) -> Graph:
    """A Hugging Face model captured in memory (:func:`rulegraph.exporters.hf.capture_hf`), with the
    metadata an export would record; captured again only when its weights changed."""
    from ..exporters.hf import capture_hf
    from .fx import load_fx
    versions = tuple(p._version for p in module.parameters())
    held = _CAPTURED.get(module)
    if held is not None and held[0] == versions:
        return held[1]
    try:
        program, info = capture_hf(module)
    except (ValueError, RuntimeError) as exc:
        raise ModelError(f"cannot capture the {type(module).__name__} with torch.export: "
                         f"{str(exc).splitlines()[0]}; export it with `rulegraph export` and explain the file") from None
    metadata = {**info.metadata(), **ExportInfo(outputs=info.outputs).metadata()}
    graph = load_fx(program)
    graph.source = f"hf:{info.source}"
    graph = _with_metadata(graph, json.dumps(metadata), Path(info.source))
    _CAPTURED[module] = (versions, graph)
    return graph


def _load_pt2(path: Path) -> Graph:
    """A program saved with ``torch.export.save``, lowered by :func:`~rulegraph.loaders.fx.load_fx`:
    checked first by :func:`.pt2.check_archive` and loaded tensors-only (:func:`.pt2.tensors_only`),
    so that nothing in the file is unpickled beyond tensors, and nothing expands past the limits."""
    import torch

    from .fx import load_fx
    from .pt2 import check_archive, tensors_only
    if not path.is_file():
        raise ModelError(f"model file not found: {path}" if not path.exists() else f"{path} is not a file")
    check_archive(path)
    loggers = [logging.getLogger(name) for name in ("torch.export", "torch._export", "torch.export.pt2_archive")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)           # torch logs a traceback before it raises
    extra = {FX_METADATA: ""}
    try:
        with tensors_only(path):
            program = torch.export.load(str(path), extra_files=extra)
    except ModelError:
        raise
    except Exception as exc:  # zip, pickle and schema errors
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"{path} is not a readable torch.export program ({type(exc).__name__}: {first})") from None
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    graph = load_fx(program)
    graph.source = f"fx:{path}"
    return _with_metadata(graph, extra[FX_METADATA], path) if extra[FX_METADATA] else graph


def _with_metadata(graph: Graph, text: str | bytes, path: Path) -> Graph:
    """The graph with the export's metadata, its outputs renamed as the export names them
    (``rulegraph.outputs``: a JSON list; an ``Identity`` node gives each its name)."""
    try:
        metadata = json.loads(text)
        names = json.loads(metadata.get(KEY["outputs"].name, "[]"))
    except (json.JSONDecodeError, AttributeError, TypeError):
        raise ModelError(f"{path}: its {FX_METADATA} is not valid JSON metadata") from None
    nodes, outputs = list(graph.nodes), list(graph.outputs)
    if len(names) == len(outputs) and all(isinstance(n, str) for n in names):
        taken = set(graph.producer) | set(graph.constants) | set(graph.input_names)
        for k, (old, new) in enumerate(zip(graph.outputs, names)):
            if new != old and new not in taken:
                nodes.append(Node(new, "Identity", (old,), (new,), scope=graph.producer[old].scope
                                  if old in graph.producer else ""))
                outputs[k] = new
    return Graph(nodes, graph.inputs, outputs, graph.constants, opset=graph.opset, name=graph.name,
                 metadata={**graph.metadata, **{str(k): str(v) for k, v in metadata.items()}}, source=graph.source)
