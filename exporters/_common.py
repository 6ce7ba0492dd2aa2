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
#: The time axis of a waveform ``[batch, samples]`` (an audio classifier's ``input_values``).
SAMPLES_AXIS = "samples"

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


#: the inputs that get dynamic axes, by (rank, floating point): token ids and masks ``[batch, sequence]``,
#: images ``[batch, channels, height, width]`` (their size is the model's, so only the batch is dynamic)
DYNAMIC_AXES: dict[tuple[int, bool], dict[int, str]] = {
    (2, False): {0: BATCH_AXIS, 1: SEQUENCE_AXIS},
    (4, True): {0: BATCH_AXIS},
}
#: the inputs that get dynamic axes by their name (the audio heads' own): a waveform ``[batch, samples]``,
#: log-mel features ``[batch, mel bins, frames]`` (their frames are the encoder's); another float input of
#: rank 2 or 3 (a table's features) keeps its traced shape
NAMED_DYNAMIC_AXES: dict[tuple[str, int], dict[int, str]] = {
    ("input_values", 2): {0: BATCH_AXIS, 1: SAMPLES_AXIS},
    ("input_features", 3): {0: BATCH_AXIS},
}


def dynamic_axes(example_inputs: Mapping[str, torch.Tensor]) -> dict[str, dict[int, str]]:
    """The dynamic axes of each input that has some (see :data:`DYNAMIC_AXES`), by axis name."""
    out = {}
    for name, value in example_inputs.items():
        if value.dtype.is_complex or value.dtype == torch.bool:
            continue
        axes = NAMED_DYNAMIC_AXES.get((name, value.dim())) if value.dtype.is_floating_point else None
        axes = axes or DYNAMIC_AXES.get((value.dim(), value.dtype.is_floating_point))
        if axes:
            out[name] = {axis: sequence_axis(name) if dim == SEQUENCE_AXIS else dim for axis, dim in axes.items()}
    return out


def sequence_axis(name: str) -> str:
    """The name of input ``name``'s sequence axis: an encoder–decoder's ``decoder_*`` inputs have
    their own length (the target prefix), every other input shares ``sequence``."""
    return DECODER_SEQUENCE_AXIS if name.startswith("decoder_") else SEQUENCE_AXIS


def check_dynamic_sizes(example_inputs: Mapping[str, torch.Tensor], axes: Mapping[str, Mapping[int, str]]) -> None:
    """Raise ``ValueError`` if a dynamic axis has example size 0 or 1, which torch.export would fix as a constant."""
    for name, dims in axes.items():
        for axis in dims:
            size = example_inputs[name].shape[axis]
            if size < 2:
                raise ValueError(
                    f"example input {name!r} has size {size} on axis {axis}; "
                    "use at least 2 so the axis can be exported as dynamic"
                )


def torch_export_dynamic_shapes(
    example_inputs: Mapping[str, torch.Tensor], axes: Mapping[str, Mapping[int, str]], *, named: bool
) -> dict[str, dict[int, object] | None]:
    """``dynamic_shapes`` making the ``axes`` of each input dynamic.

    With ``named``, the axes are one shared ``Dim`` per axis name (``batch``, ``sequence``,
    ``decoder_sequence``),
    which the dynamo ONNX exporter turns into the graph's axis names (it relaxes their
    ranges itself). Otherwise they are ``Dim.DYNAMIC``, which lets
    :func:`torch.export.export` infer bounds such as ``sequence <= max_position_embeddings``
    instead of failing on them.
    """
    dims = {axis: torch.export.Dim(axis) for axis in (BATCH_AXIS, SEQUENCE_AXIS, DECODER_SEQUENCE_AXIS, SAMPLES_AXIS)}
    return {name: ({axis: dims[dim] if named else torch.export.Dim.DYNAMIC for axis, dim in axes[name].items()}
                   if name in axes else None) for name in example_inputs}


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
