"""Export a torch module to a checked ONNX file with readable names, dynamic axes and metadata."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

import onnx
import torch

from ._common import (
    BATCH_AXIS,
    check_dynamic_sizes,
    check_example_inputs,
    dynamic_axes as axes_of,
    eval_mode,
    quiet,
    torch_export_dynamic_shapes,
)
from .check import verify
from .external import EXTERNAL_DATA_THRESHOLD, data_file, finalize
from ..errors import ExportError
from ..loaders.metadata import KEY
from ..registry import Registry

#: The exporters :func:`export_onnx` can use, by name: torch's TorchScript tracer and its torch.export-based
#: one. Each is ``fn(module, example_inputs, path, opset, dynamic_axes, output_names)``.
EXPORTERS: Registry = Registry("exporter")
#: The lowest opset accepted (the first with a LayerNormalization op).
MIN_OPSET = 17
#: Metadata keys (:data:`rulegraph.loaders.metadata.KEYS`): the exporter used, the export check's result (which
#: exporter, at which sizes, how close), the longest sequence the model takes (the check's sizes stay within it)
EXPORTER_KEY, CHECK_KEY, MAX_LENGTH_KEY = (KEY[k].name for k in ("exporter", "export_check", "max_length"))


#: The highest opset each exporter writes (torch 2.x: the TorchScript exporter stops at 20).
MAX_OPSET = {"torchscript": 20, "dynamo": 23}


def check_exporter_options(exporter: str, opset: int) -> None:
    """Raise ``ValueError`` for an unknown exporter name or an opset outside what it can write."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; valid: {', '.join(EXPORTERS)}")
    top = MAX_OPSET.get(exporter, MIN_OPSET)
    if not isinstance(opset, int) or isinstance(opset, bool) or not MIN_OPSET <= opset <= top:
        raise ValueError(f"opset {opset!r} is not supported by the {exporter} exporter; valid: {MIN_OPSET}…{top}")


def refuse_overwrite(path: Path) -> None:
    """Raise ``FileExistsError`` if ``path`` exists."""
    if path.exists():
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")  # the CLI says --force


def export_onnx(
    module: torch.nn.Module,
    example_inputs: Mapping[str, torch.Tensor],
    path: str | os.PathLike,
    *,
    exporter: str = "torchscript",
    opset: int = 18,
    dynamic_axes: bool = True,
    output_names: Sequence[str] = ("logits",),
    metadata: Mapping[str, str] | None = None,
    overwrite: bool = False,
    external_data: int = EXTERNAL_DATA_THRESHOLD,
    check: bool = True,
    finish: Callable[[dict], dict] | None = None,
) -> Path:
    """Export ``module`` to an ONNX file and return its path.

    ``module.forward`` is called with ``example_inputs`` as keyword arguments, so the
    dict keys must be its parameter names (in the order they are given, they also
    become the ONNX graph's input names). The module is traced in eval mode.

    Args:
        module: the model to export.
        example_inputs: input name -> example tensor.
        path: the ``.onnx`` file to write; parent folders are created.
        exporter: ``"torchscript"`` (``torch.onnx.export(dynamo=False)``) or
            ``"dynamo"`` (the torch.export-based exporter).
        opset: the ONNX opset, at least :data:`MIN_OPSET`.
        dynamic_axes: give every 2-D integer input dynamic axes named ``batch`` and
            ``sequence``, every 4-D float input (images) a dynamic ``batch`` axis, and axis 0
            of every output the name ``batch`` (see ``DYNAMIC_AXES``). With the
            dynamo exporter these axes need example sizes of at least 2.
        output_names: names of the module's outputs, in order.
        metadata: string key/value pairs stored in the model's ``metadata_props``;
            ``rulegraph.exporter`` is added unless given.
        overwrite: replace ``path`` if it exists (otherwise ``FileExistsError``).
        external_data: above this many bytes of weights (``0``: always; over 2 GiB: always) they
            are written to ``<path>.data`` beside the model as ONNX external data, streamed from
            the exporter's output (see :mod:`rulegraph.exporters.external`).
        check: before anything is written, run the exported graph at two input sizes other than the
            traced one and compare it with the module (:mod:`rulegraph.exporters.check`); on a
            mismatch (or a failing exporter) try the other exporter, and raise ``ExportError`` with the
            figures when none is right. The result is recorded as ``rulegraph.export_check``.
        finish: makes the check's resized inputs ones the module accepts (see
            :func:`~rulegraph.exporters.check.verify`).

    Raises:
        ValueError: bad exporter name, opset, example inputs or metadata.
        FileExistsError: ``path`` exists and ``overwrite`` is false.
        ExportError: no exporter gives a graph that computes what the module computes (nothing is written).
    """
    check_exporter_options(exporter, opset)
    check_example_inputs(example_inputs)
    _metadata_props(metadata, exporter)
    path = Path(path)
    if not isinstance(external_data, int) or isinstance(external_data, bool) or external_data < 0:
        raise ValueError(f"external_data must be a number of bytes ≥ 0, got {external_data!r}")
    if not overwrite:
        refuse_overwrite(path)
        refuse_overwrite(data_file(path))
    dynamic = axes_of(example_inputs) if dynamic_axes else {}
    if exporter == "dynamo":
        check_dynamic_sizes(example_inputs, dynamic)
    limit = (metadata or {}).get(MAX_LENGTH_KEY, "")
    path.parent.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    for name in _exporters(exporter, opset, check):
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".onnx-export-") as scratch:
            raw = Path(scratch) / "raw" / "raw.onnx"
            raw.parent.mkdir()
            try:
                with eval_mode(module), quiet():
                    EXPORTERS.get(name)(module, example_inputs, raw, opset, dynamic, list(output_names))
            except Exception as exc:
                if not check:
                    raise
                failures.append(f"the {name} exporter fails ({_first_line(exc)})")
                continue
            props = _metadata_props(metadata, name)
            if check:
                verdict = verify(raw, module, example_inputs, dynamic, output_names,
                                 int(limit) if limit.isdigit() else None, finish)
                if not verdict.ok:
                    failures.append(f"the {name} export is wrong: {verdict.summary}")
                    continue
                props[CHECK_KEY] = "; ".join([*failures, f"{name}: {verdict.summary}"])
            staged = Path(scratch) / "staged" / path.name
            staged.parent.mkdir()
            stage(raw, staged, props, external_data)
            shutil.rmtree(raw.parent)
            publish(staged, path)
        return path
    raise ExportError(f"{path}: no export computes what the module computes — {'; '.join(failures)}; "
                      "nothing was written")


def _exporters(first: str, opset: int, fallback: bool) -> list[str]:
    """``first``, then (with ``fallback``) the other exporters that can write ``opset``."""
    others = [e for e in EXPORTERS if e != first and opset <= MAX_OPSET.get(e, MIN_OPSET)] if fallback else []
    return [first, *others]


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def stage(raw: Path, staged: Path, props: Mapping[str, str], external_data: int) -> None:
    """The exporter's file ``raw`` (and its data files) with ``props`` added to its metadata, written
    to ``staged`` inline or with external data (:func:`~rulegraph.exporters.external.finalize`) and
    checked there; the weights are streamed, never held whole."""
    model = onnx.load(str(raw), load_external_data=False)
    onnx.helper.set_model_props(model, {**_existing_props(model), **props})
    finalize(model, raw.parent, staged, external_data)
    del model
    onnx.checker.check_model(str(staged))      # from the path: a model with external data is checked too


def publish(staged: Path, path: Path) -> None:
    """Move a staged export (and its data file) to ``path``, the data file first; the data file of an
    earlier export there, which an inline export does not read, is removed."""
    data, old = data_file(staged), data_file(path)
    inline = not data.exists()
    if not inline:
        os.replace(data, old)
    os.replace(staged, path)
    if inline and old.exists():
        old.unlink()


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """Return the ``metadata_props`` of the ONNX file at ``path`` as a dict (weights are not loaded)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    return _existing_props(onnx.load(path, load_external_data=False))


def _metadata_props(metadata: Mapping[str, str] | None, exporter: str) -> dict[str, str]:
    """Validate user metadata and add the exporter name."""
    props = dict(metadata or {})
    for key, value in props.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ValueError(f"metadata must map strings to strings; got {key!r}: {value!r}")
    props.setdefault(EXPORTER_KEY, exporter)
    return props


def _existing_props(model: onnx.ModelProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in model.metadata_props}


@EXPORTERS.register("torchscript")
def _export_torchscript(
    module: torch.nn.Module,
    example_inputs: Mapping[str, torch.Tensor],
    path: Path,
    opset: int,
    dynamic: dict[str, dict[int, str]],
    output_names: list[str],
) -> None:
    axes: dict[str, dict[int, str]] = {name: dict(dims) for name, dims in dynamic.items()}
    if dynamic:
        axes.update({name: {0: BATCH_AXIS} for name in output_names})
    torch.onnx.export(
        module,
        (),
        str(path),
        kwargs=dict(example_inputs),
        input_names=list(example_inputs),
        output_names=output_names,
        opset_version=opset,
        dynamic_axes=axes or None,
        dynamo=False,
    )


@EXPORTERS.register("dynamo")
def _export_dynamo(
    module: torch.nn.Module,
    example_inputs: Mapping[str, torch.Tensor],
    path: Path,
    opset: int,
    dynamic: dict[str, dict[int, str]],
    output_names: list[str],
) -> None:
    check_dynamic_sizes(example_inputs, dynamic)
    torch.onnx.export(
        module,
        (),
        str(path),
        kwargs=dict(example_inputs),
        input_names=list(example_inputs),
        output_names=output_names,
        opset_version=opset,
        dynamic_shapes=torch_export_dynamic_shapes(example_inputs, dynamic, named=True) if dynamic else None,
        dynamo=True,
        external_data=True,
        verbose=False,
    )
