"""The graph's own rounding, made visible for integer-quantized graphs.

A graph that rounds its activations to integers (``quantize_dynamic``'s ``DynamicQuantizeLinear``, a
static QDQ graph's ``QuantizeLinear → DequantizeLinear`` pairs; the ``quantization`` canonizer writes
each as a ``QuantizeDequantize`` node) is not continuous: an activation an ulp away from a rounding
boundary lands on the other integer, and the change runs through every later layer. rulegraph computes
the same rounding from its own float arithmetic, which differs from onnxruntime's kernels by float
rounding, so its forward may differ from onnxruntime's by as much as a nudge of the input moves
onnxruntime's own output. :func:`measure` says both, so the reader can tell the one from the other:

* **difference**: ``max |rulegraph − onnxruntime| / max |onnxruntime|`` over the explained value (the
  value as rulegraph computes it, in the run's dtype, and as onnxruntime computes it from the same
  inputs in the file; relative to the largest magnitude, so a logit's scale does not count);
* **spread**: onnxruntime's own output under a one-ulp nudge of its float input, the same measure
  between the nudged and the plain run, the largest over :data:`NUDGES` nudges. A nudge moves every
  element of the input one ulp up or down (``nextafter``), by a fixed pseudo-random sign per element
  (a nudge of every element the same way is nearly a change of scale, which a LayerNorm cancels; the
  nudge of a float input is taken in float32, where the run's inputs are float64). The
  float input is the graph's float inputs where it has any (an image); a token model's is the float
  tables its ids read (every initializer of rank ≥ 2 a ``Gather`` picks rows from). To nudge those, the
  session loads the file's model with each table ``T`` read as ``T + N``, ``N`` a new input that is 0 in
  the plain run and ``nextafter(T) − T`` (exact) in a nudged one, so one session serves every run; a table
  stored as integers (``quantize_dynamic``'s uint8 tables, read through a per-tensor ``DequantizeLinear``)
  is first the float table ``(q − zero point) · scale`` that the ``DequantizeLinear`` computes (in the
  scale's float type), so the plain run gives the file's output bit for bit.

A rounding boundary crossed or not is a matter of chance, so the spread is a sample: a difference larger
than the spread measured says rulegraph's forward moved more than these nudges moved onnxruntime's.
The difference is *within the graph's rounding* where it is at most the spread. Only graphs with such
rounding are measured (a float graph or one with integer weights only gets nothing); without
onnxruntime, or where it cannot compute the value from the file, a note says why. onnxruntime's sessions
are kept on the graph (:mod:`rulegraph.sessions`): two per graph and explained value at most (the file's, and
for a token model the one that nudges its tables); an explanation with an audit costs 1 + :data:`NUDGES`
onnxruntime runs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np
import torch

from .ir import Graph
from .ops.quantization import RULEGRAPH_DOMAIN

#: the node the quantization canonizer writes for an activation rounded to integers
ROUNDING_OP = "QuantizeDequantize"
#: how many nudges the spread is the largest of (sign patterns 0…NUDGES−1, :func:`nudge`)
NUDGES = 4
#: two float32 runtimes agree to about this share of the largest output on any graph (rulegraph and
#: onnxruntime, measured on the deployed test files: ≤ 4e-6)
RUNTIME_AGREEMENT = 1e-5


@dataclass(frozen=True)
class Rounding:
    """The explained value against onnxruntime's, and onnxruntime's own spread under a one-ulp nudge of
    its float input (see the module docstring); ``note`` instead where it was not measured."""

    difference: float | None = None
    spread: float | None = None
    nudged: str = ""          # what was nudged: "inputs x" or "tables a, b"
    note: str = ""

    @property
    def verdict(self) -> str | None:
        """``as float32 runtimes agree`` (the difference at most :data:`RUNTIME_AGREEMENT`), ``within the
        graph's rounding`` (at most the spread) or ``larger than the spread measured``; None where not measured."""
        if self.difference is None:
            return None
        if self.difference <= RUNTIME_AGREEMENT:
            return "as float32 runtimes agree"
        return "within the graph's rounding" if self.difference <= self.spread else "larger than the spread measured"

    def line(self) -> str:
        """One line: ``forward vs onnxruntime: 1.3e-01 (onnxruntime's own one-ulp spread: 1.2e-01 — within
        the graph's rounding)``."""
        if self.difference is None:
            return self.note
        verdict = self.verdict
        return (f"forward vs onnxruntime: {self.difference:.1e} (onnxruntime's own one-ulp spread: "
                f"{self.spread:.1e} — {verdict})")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict, "line": self.line()}


def rounds(graph: Graph) -> bool:
    """Whether the graph rounds activations to integers (the quantization canonizer wrote a round trip)."""
    return any(n.op == ROUNDING_OP and n.domain == RULEGRAPH_DOMAIN for n in graph.nodes)


def measure(graph: Graph, inputs: Mapping[str, Any], output: str, value: torch.Tensor) -> Rounding | None:
    """For a graph that :func:`rounds`: ``value`` (the explained value rulegraph computed for ``inputs``)
    against onnxruntime's, and onnxruntime's one-ulp spread; None for any other graph."""
    if not rounds(graph):
        return None
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return Rounding(note="forward vs onnxruntime: not measured (onnxruntime is not installed)")
    from .sessions import file_source, run, session
    if file_source(graph, output) is None:
        return Rounding(note=f"forward vs onnxruntime: not measured (onnxruntime does not compute {output!r} "
                             "from a file)")
    try:
        plain = run(session(graph, output), output, inputs).astype(np.float64)
        floats = [k for k, v in inputs.items() if torch.as_tensor(v).is_floating_point()]
        if floats:
            nudged, made = "inputs " + ", ".join(floats), session(graph, output)
            runs = [run(made, output, {**inputs, **{k: nudge(_float32(inputs[k]), n) for k in floats}})
                    for n in range(NUDGES)]
        else:
            source, found = _tables(graph, output)
            if not found:
                return Rounding(note="forward vs onnxruntime: not measured (no float input or embedding table to "
                                     "nudge)")
            nudged, made = "tables " + ", ".join(found), session(graph, output, name="nudgeable", source=source)
            runs = [run(made, output, {**inputs, **{k: nudge(t, n) - t for k, t in found.values()}})
                    for n in range(NUDGES)]
    except Exception as exc:    # noqa: BLE001 — onnxruntime refusing the file is a note, not a failure of the explanation
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Rounding(note=f"forward vs onnxruntime: not measured (onnxruntime: {reason})")
    ours = value.detach().to("cpu", torch.float64).numpy()
    if ours.size != plain.size:
        return Rounding(note=f"forward vs onnxruntime: not measured (shapes {ours.shape} and {plain.shape})")
    scale = float(np.abs(plain).max()) or 1.0
    difference = float(np.abs(ours.reshape(plain.shape) - plain).max()) / scale
    spread = max(float(np.abs(r.astype(np.float64) - plain).max()) for r in runs) / scale
    return Rounding(difference, spread, nudged)


def nudge(x: np.ndarray, pattern: int) -> np.ndarray:
    """``x`` with every element moved one ulp, up or down by a pseudo-random sign per element drawn with
    the seed ``pattern``: a change at the last bit that no normalization cancels, as a nudge of every element
    the same way nearly would be by a LayerNorm."""
    up = np.random.default_rng(pattern).integers(0, 2, size=x.shape).astype(bool)
    return np.where(up, np.nextafter(x, np.asarray(np.inf, x.dtype)),
                    np.nextafter(x, np.asarray(-np.inf, x.dtype))).astype(x.dtype)


def _float32(x: Any) -> np.ndarray:
    """``x`` in the float type onnxruntime reads (float32 unless given in another float type)."""
    array = torch.as_tensor(x).detach().cpu().numpy()
    return array.astype(np.float32) if array.dtype == np.float64 else array


def _tables(graph: Graph, output: str) -> tuple[bytes, dict[str, tuple[str, np.ndarray]]]:
    """The file's model as onnxruntime runs it to give ``output``, each embedding table ``T`` read as
    ``T + N`` with ``N`` a new input (see the module docstring), and those tables: their name in the file →
    (the input ``N``'s name, the float table). Made once per graph and output."""
    key = ("tables", output)
    sessions = graph.cache.sessions
    if key not in sessions:
        import onnx
        from onnx import helper, numpy_helper
        from .sessions import onnx_file
        proto = onnx.load(onnx_file(graph))
        if output not in {o.name for o in proto.graph.output}:
            proto.graph.output.append(onnx.ValueInfoProto(name=output))
        inits = {i.name: i for i in proto.graph.initializer}
        consumers: dict[str, list] = {}
        for n in proto.graph.node:
            for v in n.input:
                consumers.setdefault(v, []).append(n)
        found: dict[str, tuple[str, np.ndarray]] = {}
        added, replaced = [], set()         # the Adds; the tables and their parameters, dropped where unused
        producer = {v: n for n in proto.graph.node for v in n.output}
        for gather in list(proto.graph.node):
            if gather.op_type != "Gather":
                continue
            data, readers = gather.input[0], consumers.get(gather.output[0], [])
            dq = producer.get(data)
            if data in inits and len(inits[data].dims) >= 2:
                name, table = data, numpy_helper.to_array(inits[data])
                if not np.issubdtype(table.dtype, np.floating):     # an integer table read through DequantizeLinear
                    params = {(tuple(r.input[1:3]), _axis(r)) for r in readers}
                    if not readers or len(params) != 1 or any(r.op_type != "DequantizeLinear" for r in readers):
                        continue
                    table = _dequantized(table, *next(iter(params)), inits, replaced, gathered=True)
                    if table is None:
                        continue
                    for r in readers:
                        r.CopyFrom(helper.make_node("Identity", [gather.output[0]], list(r.output), name=r.name))
            elif dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits \
                    and len(inits[dq.input[0]].dims) >= 2:          # a table dequantized, then read (QDQ)
                name = dq.input[0]
                table = _dequantized(numpy_helper.to_array(inits[name]), tuple(dq.input[1:3]), _axis(dq), inits,
                                     replaced)
                if table is None:
                    continue
            else:
                continue
            if name in found:
                gather.input[0] = f"{name}::nudged"
                continue
            plain, nudge_input = f"{name}::float", f"{name}::nudge"
            proto.graph.initializer.append(numpy_helper.from_array(table, plain))
            proto.graph.input.append(helper.make_tensor_value_info(
                nudge_input, helper.np_dtype_to_tensor_dtype(table.dtype), list(table.shape)))
            added.append(helper.make_node("Add", [plain, nudge_input], [f"{name}::nudged"], name=f"{name}::nudge"))
            gather.input[0] = f"{name}::nudged"
            found[name] = (nudge_input, table)
            replaced.add(name)
        proto.graph.node.extend(added)
        read = {v for n in proto.graph.node for v in n.input} | {o.name for o in proto.graph.output}
        nodes = [n for n in proto.graph.node       # a table's DequantizeLinear that nothing reads any more: dropped
                 if not (n.op_type == "DequantizeLinear" and n.input[0] in replaced and n.output[0] not in read)]
        # the Adds first: a graph's nodes are in topological order
        del proto.graph.node[:]
        proto.graph.node.extend([n for n in nodes if n.op_type == "Add" and n.name.endswith("::nudge")]
                                + [n for n in nodes if not (n.op_type == "Add" and n.name.endswith("::nudge"))])
        used = {v for n in proto.graph.node for v in n.input}
        kept = [i for i in proto.graph.initializer if i.name in used or i.name not in replaced]
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(kept)
        sessions[key] = (proto.SerializeToString(), found)
    return sessions[key]


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def _dequantized(q: np.ndarray, params: tuple, axis: int, inits: dict, replaced: set, *,
                 gathered: bool = False) -> np.ndarray | None:
    """``(q − zero point) · scale`` as ``DequantizeLinear`` computes it (in the scale's float type), from
    initializers: per tensor, or per ``axis`` of ``q`` (not for rows already gathered); else None. The
    scale and zero point are added to ``replaced``."""
    from onnx import numpy_helper
    scale, zero = (list(params) + [""])[:2]
    if scale not in inits or (zero and zero not in inits):
        return None
    s = numpy_helper.to_array(inits[scale])
    z = numpy_helper.to_array(inits[zero]).astype(np.int32) if zero else np.zeros((), np.int32)
    if s.size == 1 and z.size == 1:
        shape = ()
    elif gathered or s.ndim != 1 or z.size not in (1, s.size):
        return None
    else:
        shape = [1] * q.ndim
        shape[axis % q.ndim] = s.size
    replaced.update((scale, zero))
    return ((q.astype(np.int32) - z.reshape(shape if z.size > 1 else ())).astype(s.dtype)
            * s.reshape(shape)).astype(s.dtype)
