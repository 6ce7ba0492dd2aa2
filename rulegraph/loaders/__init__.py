"""Loaders: an exported model (ONNX file or ModelProto, torch.export program, fx GraphModule) → IR."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import ModelError
from ..ir import Graph


def load(model: Any) -> Graph:
    """Load ``model`` into the IR.

    Accepts a path to an ``.onnx`` file (or a directory holding one), a ``.pt2`` file
    written by ``torch.export.save``, an ``onnx.ModelProto``, a
    ``torch.export.ExportedProgram``, or a ``torch.fx.GraphModule`` produced by
    ``torch.export``. A :class:`~rulegraph.ir.Graph` is returned unchanged.
    """
    if isinstance(model, Graph):
        return model
    return _with_outputs(_load(model))


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
    raise ModelError(f"cannot load a {type(model).__name__}; give an .onnx path, an onnx.ModelProto, "
                     "a torch.export.ExportedProgram or an fx GraphModule")


def _load_pt2(path: Path) -> Graph:
    """A program saved with ``torch.export.save``, lowered by :func:`~rulegraph.loaders.fx.load_fx`."""
    import torch

    from .fx import load_fx
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    quiet = logging.getLogger("torch.export")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)           # torch logs a traceback before it raises
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # zip, pickle and schema errors
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"{path} is not a readable torch.export program ({type(exc).__name__}: {first})") from None
    finally:
        quiet.setLevel(level)
    graph = load_fx(program)
    graph.source = f"fx:{path}"
    return graph
