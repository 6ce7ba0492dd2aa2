"""Helpers shared by the ONNX and torch.fx exporters."""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from typing import Iterator, Mapping

import torch

#: Names given to the dynamic axes of 2-D integer inputs (token ids, masks).
BATCH_AXIS = "batch"
SEQUENCE_AXIS = "sequence"
#: The sequence axis of a decoder's inputs (``decoder_input_ids``…), free of the source's length.
DECODER_SEQUENCE_AXIS = "decoder_sequence"

# Loggers whose warnings about tracing and export internals are noise to a user.
_NOISY_LOGGERS = ("torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch.fx", "torch.utils._sympy", "onnxscript")


def check_example_inputs(example_inputs: Mapping[str, torch.Tensor]) -> None:
    """Raise ``ValueError`` unless ``example_inputs`` is a non-empty mapping of names to tensors."""
    if not isinstance(example_inputs, Mapping) or not example_inputs:
        raise ValueError("example_inputs must be a non-empty dict mapping input names to tensors")
    for name, value in example_inputs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"example input name {name!r} is not a valid Python identifier")
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"example input {name!r} is a {type(value).__name__}, not a torch.Tensor")


def dynamic_input_names(example_inputs: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the inputs that get dynamic batch and sequence axes: the 2-D integer tensors."""
    return [
        name
        for name, value in example_inputs.items()
        if value.dim() == 2 and not value.dtype.is_floating_point and not value.dtype.is_complex and value.dtype != torch.bool
    ]


def sequence_axis(name: str) -> str:
    """The name of input ``name``'s sequence axis: an encoder–decoder's ``decoder_*`` inputs have
    their own length (the target prefix), every other input shares ``sequence``."""
    return DECODER_SEQUENCE_AXIS if name.startswith("decoder_") else SEQUENCE_AXIS


def check_dynamic_sizes(example_inputs: Mapping[str, torch.Tensor], names: list[str]) -> None:
    """Raise ``ValueError`` if a dynamic axis has example size 0 or 1, which torch.export would fix as a constant."""
    for name in names:
        for axis, size in enumerate(example_inputs[name].shape):
            if size < 2:
                raise ValueError(
                    f"example input {name!r} has size {size} on axis {axis}; "
                    "use at least 2 so the axis can be exported as dynamic"
                )


def torch_export_dynamic_shapes(
    example_inputs: Mapping[str, torch.Tensor], names: list[str], *, named: bool
) -> dict[str, dict[int, object] | None]:
    """``dynamic_shapes`` making axes 0 and 1 of the ``names`` inputs dynamic.

    With ``named``, the axes are one shared ``Dim("batch")`` and a ``Dim`` per
    :func:`sequence_axis` name, which the dynamo ONNX exporter turns into the graph's axis
    names (it relaxes their ranges itself). Otherwise they are ``Dim.DYNAMIC``, which lets
    :func:`torch.export.export` infer bounds such as ``sequence <= max_position_embeddings``
    instead of failing on them.
    """
    if not named:
        return {name: ({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC} if name in names else None)
                for name in example_inputs}
    dims = {axis: torch.export.Dim(axis) for axis in (BATCH_AXIS, SEQUENCE_AXIS, DECODER_SEQUENCE_AXIS)}
    return {name: ({0: dims[BATCH_AXIS], 1: dims[sequence_axis(name)]} if name in names else None)
            for name in example_inputs}


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the warnings, log lines and progress prints that tracing and exporting emit."""
    saved_levels = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    try:
        for name in _NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Put ``module`` in eval mode (no dropout) for the duration, then restore every
    submodule's own training flag (a blanket ``train(flag)`` would switch on the dropout
    of a wrapped model that was in eval mode)."""
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in flags:
            m.training = training
