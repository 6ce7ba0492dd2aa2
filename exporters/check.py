"""Every export is checked before it is written.

An exporter can write a graph that runs only at the traced input size, or that runs at every size
but computes something else there (a length the tracer baked in as a constant) — and nothing else
would notice: the audit of an explanation checks the graph against itself. :func:`verify` runs the
exported graph with onnxruntime at two input sizes other than the traced one (batch 1 and 3, the
sequence 3 shorter and 5 longer; images: the batch only) and compares every output with the torch
module's on the same inputs, to :data:`TOLERANCE` of the largest output (by the weights' dtype).
Where onnxruntime has no kernel for the graph's types (bfloat16 on CPU), rulegraph's interpreter
runs it instead, in that dtype. :func:`~rulegraph.exporters.export_onnx` tries the other exporter
on a mismatch and writes nothing when neither is right.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch

from ._common import BATCH_AXIS, DECODER_SEQUENCE_AXIS, SEQUENCE_AXIS, eval_mode, quiet

#: an export agrees with its module when every output is within this share of the output's largest
#: magnitude, by the dtype of the module's weights (half precisions round per op, differently in torch
#: and in the runtime)
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}
#: the sizes checked: (batch, sequence − traced, decoder sequence − traced), each other than the traced one
VARIANTS = ((1, -3, -1), (3, 5, 2))


@dataclass(frozen=True)
class Verdict:
    """Whether an export computes what its module computes, and the figures, in one line."""

    ok: bool
    summary: str


def sizes(example: Mapping[str, torch.Tensor], axes: Mapping[str, Mapping[int, str]],
          max_length: int | None = None) -> list[dict[str, int]]:
    """The axis sizes of the two checks (axis name → size), each other than the traced ones."""
    traced: dict[str, int] = {}
    for name, dims in axes.items():
        for axis, symbol in dims.items():
            traced.setdefault(symbol, int(example[name].shape[axis]))
    out = []
    for batch, step, decoder_step in VARIANTS:
        chosen = {}
        for symbol, size in traced.items():
            if symbol == BATCH_AXIS:
                chosen[symbol] = batch if batch != size else batch + 1
            else:
                delta = decoder_step if symbol == DECODER_SEQUENCE_AXIS else step
                top = max_length or math.inf
                new = size + delta if 2 <= size + delta <= top else max(2, size - abs(delta) - 1)
                chosen[symbol] = new if new != size else size + 1
        out.append(chosen)
    return out


def resized(example: Mapping[str, torch.Tensor], axes: Mapping[str, Mapping[int, str]],
            chosen: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """The example inputs cut or cyclically repeated along their dynamic axes to the ``chosen`` sizes
    (token ids stay ids of the vocabulary, masks stay masks)."""
    out = {}
    for name, value in example.items():
        for axis, symbol in axes.get(name, {}).items():
            index = torch.arange(chosen[symbol]) % value.shape[axis]
            value = value.index_select(axis, index)
        out[name] = value
    return out


def _describe(chosen: Mapping[str, int]) -> str:
    return " × ".join(f"{symbol} {size}" for symbol, size in chosen.items()) or "the traced size"


def _outputs(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _outputs(r)]
    if hasattr(result, "to_tuple"):
        return _outputs(result.to_tuple())
    raise TypeError(f"the module returned a {type(result).__name__}, not tensors")


def weight_dtype(module: torch.nn.Module) -> torch.dtype:
    """The floating dtype of the module's weights (float32 if it has none)."""
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


class _Runner:
    """Runs the exported file: onnxruntime, or rulegraph's interpreter where onnxruntime has no kernel
    (and for a torch.export program, which rulegraph lowers)."""

    def __init__(self, path, dtype: torch.dtype):
        self.path, self.dtype = path, dtype
        self.session = None
        self.name = "onnxruntime"
        if isinstance(path, torch.export.ExportedProgram):
            self._interpreter()
            return
        import onnxruntime as ort
        try:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            # the graph as written, its weights held once (no optimised or pre-packed copies)
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.add_session_config_entry("session.disable_prepacking", "1")
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:                 # no kernel for a type (bfloat16), or an unknown op
            if "NOT_IMPLEMENTED" not in str(exc) and "not implemented" not in str(exc).lower():
                raise
            self._interpreter()

    def _interpreter(self) -> None:
        from ..loaders import load
        self.session, self.name = load(self.path), "rulegraph's interpreter"

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        if self.name == "onnxruntime":
            try:
                return [torch.from_numpy(o) for o in self.session.run(None, {k: v.numpy() for k, v in inputs.items()})]
            except Exception as exc:
                if "NOT_IMPLEMENTED" not in str(exc):
                    raise
                self._interpreter()
        from ..interpreter import run
        dtype = self.dtype if self.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16) \
            else torch.float32
        return list(run(self.session, dict(inputs), dtype=dtype).values())


def verify(path: Path | torch.export.ExportedProgram, module: torch.nn.Module, example: Mapping[str, torch.Tensor],
           axes: Mapping[str, Mapping[int, str]], output_names: Sequence[str],
           max_length: int | None = None, finish: Callable[[dict], dict] | None = None) -> Verdict:
    """Run the exported graph (an ONNX file, or a torch.export program through rulegraph's fx loader)
    at :func:`sizes` other than the traced ones and compare its outputs with the module's (see the
    module docstring). ``finish``: makes resized inputs ones the module accepts (e.g. an
    encoder–decoder classifier's rows each ending in one eos token)."""
    dtype = weight_dtype(module)
    tolerance = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    checks = sizes(example, axes, max_length) if axes else [{}]
    try:
        runner = _Runner(path, dtype)
    except Exception as exc:
        return Verdict(False, f"it cannot be loaded ({_first_line(exc)})")
    worst, scale = 0.0, 0.0
    for chosen in checks:
        inputs = resized(example, axes, chosen) if chosen else dict(example)
        inputs = finish(inputs) if finish is not None else inputs
        with eval_mode(module), quiet(), torch.no_grad():
            expected = _outputs(module(**inputs))
        try:
            got = runner(inputs)
        except Exception as exc:
            return Verdict(False, f"{runner.name} cannot run it at {_describe(chosen)} ({_first_line(exc)})")
        for name, e, g in zip(output_names, expected, got):
            if tuple(e.shape) != tuple(g.shape):
                return Verdict(False, f"at {_describe(chosen)} output {name!r} has shape {list(g.shape)}, the "
                                      f"module's {list(e.shape)}")
            e, g = e.double(), g.double()
            top = float(e.abs().max()) if e.numel() else 0.0
            gap = float((g - e).abs().max()) if e.numel() else 0.0
            if not math.isfinite(gap) or gap > tolerance * max(top, 1e-30):
                return Verdict(False, f"at {_describe(chosen)} output {name!r} differs from the module's by "
                                      f"{gap:.1e} (largest |{name}| {top:.2e}; tolerance {tolerance:.0e} of it)")
            if gap / max(top, 1e-30) >= worst / max(scale, 1e-30):
                worst, scale = gap, top
    where = " and ".join(_describe(c) for c in checks)
    return Verdict(True, f"{runner.name} at {where} agrees with the module to {worst / max(scale, 1e-30):.1e} "
                         "of the largest output")


def _first_line(exc: Exception) -> str:
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}"[:240]
