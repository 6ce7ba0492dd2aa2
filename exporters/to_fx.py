"""Capture a torch module as a :class:`torch.export.ExportedProgram` (a torch.fx graph)."""
from __future__ import annotations

from typing import Mapping

import torch

from ._common import (
    check_dynamic_sizes,
    check_example_inputs,
    dynamic_axes,
    eval_mode,
    quiet,
    torch_export_dynamic_shapes,
)


#: the file inside a ``.pt2`` archive holding rulegraph's metadata (labels, length limit, output names),
#: as the ONNX exports keep it in ``metadata_props``
FX_METADATA = "rulegraph.json"


def export_fx(
    module: torch.nn.Module,
    example_inputs: Mapping[str, torch.Tensor],
    *,
    dynamic: bool = True,
) -> torch.export.ExportedProgram:
    """Export ``module`` with :func:`torch.export.export` and return the program.

    ``module.forward`` is called with ``example_inputs`` as keyword arguments; run the
    result with ``program.module()(**inputs)``. The module is captured in eval mode.

    Args:
        module: the model to export.
        example_inputs: input name -> example tensor.
        dynamic: make axes 0 (batch) and 1 (sequence) of every 2-D integer input
            dynamic (``torch.export.Dim.DYNAMIC``, so torch.export infers their
            bounds and that they are shared); their example sizes must then be at
            least 2.

    Raises:
        ValueError: bad example inputs.
    """
    check_example_inputs(example_inputs)
    axes = dynamic_axes(example_inputs) if dynamic else {}
    check_dynamic_sizes(example_inputs, axes)
    shapes = torch_export_dynamic_shapes(example_inputs, axes, named=False) if axes else None
    with eval_mode(module), quiet():
        return torch.export.export(module, (), kwargs=dict(example_inputs), dynamic_shapes=shapes)
