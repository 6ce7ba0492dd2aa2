"""torch.export program (or its fx GraphModule) → IR, with ONNX op names.

Every aten call in the program *as exported* (the pre-dispatch IR: ``aten.linear``,
``aten.layer_norm``, ``aten.scaled_dot_product_attention``…; no decompositions are
run) is lowered through one table, :data:`LOWERINGS`, from the target's name
(``"aten.linear.default"``) to a small function that emits IR nodes with ONNX op
types and attribute names. The lowerings mirror what torch's ONNX exporters emit at
the graph's opset (18 by default), so one rule file gives the same relevance on an
fx export and on an ONNX export of the same model:

* ``aten.linear`` → ``MatMul(x, Wᵀ)`` + ``Add(b, ·)`` (``Wᵀ`` a new constant named
  ``<weight>.T``); on 2-D inputs with a bias ``Gemm(x, W, b, transB=1)``, as both
  exporters do. ``aten.addmm`` → ``Gemm``.
* ``aten.gelu`` → ``x·½(1 + erf(x/√2))`` as ``Div → Erf → Add → Mul → Mul`` (the tanh
  form likewise), as the exporters emit before opset 20; ``Gelu`` from opset 20.
* ``aten.scaled_dot_product_attention`` → ``MatMul(q, kᵀ) → Mul(scale) →
  Add(float mask) | Where(bool mask, ·, −inf) [→ Where(causal, ·, −inf)] →
  Softmax → MatMul(·, v)``: the eager-attention pattern, so the attention-head rule
  (``MatMul`` whose input 0 comes from ``Softmax``) matches.

Symbolic sizes: ``aten.sym_size.int(x, d)`` becomes ``Shape(x, start=d, end=d+1)``,
a 1-element int64 tensor; Python arithmetic on SymInts becomes the matching ONNX op
on those tensors; a size list mixing ints and symbols becomes a ``Concat`` of
1-element pieces. Where a symbol is used as a scalar (``Range``, a ``Gather``
index, an operand of an elementwise op) it is squeezed to 0-d first. All of this
depends only on the input shapes, so the interpreter computes it once per shape.

Names: the node computing an fx node's result keeps the fx node's name
(``linear_3``) and so does its output value; extra nodes a lowering emits are named
``<fx name>.<role>`` (``linear_3.matmul``, ``scaled_dot_product_attention.softmax``,
``view.shape``), and constants it creates likewise; the outputs of a multi-output
node are ``<name>.0``, ``<name>.1``…. Parameters and buffers keep their state-dict
names (``model.bert.pooler.dense.weight``). Each node's ``scope`` is the innermost
module path of its fx node (``model.bert.encoder.layer.0.attention.self.query``).

Float constants the loader creates (scalars, fill values) are stored in float64;
the interpreter runs every float in the plan's dtype, so a float64 run is exact.
Asserts (``_assert_tensor_metadata``, ``_assert_scalar``…) are dropped, dropout and
copies become ``Identity``, and nodes whose results nothing uses are removed.
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from ..errors import ModelError, UnsupportedOpError, choices
from ..ir import Graph, Node, ValueInfo

Tensor = torch.Tensor
INT64 = torch.int64
INT64_MAX = 2**63 - 1
DEFAULT_OPSET = 18


class Sym(str):
    """The IR name of a SymInt (or SymBool): a 1-element int64 (bool) tensor."""


Lowering = Callable[["Builder", fx.Node, dict], Any]
#: target name (``"aten.linear.default"``, ``"operator.add"``) → lowering
LOWERINGS: dict[str, Lowering] = {}


def lowers(*targets: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        for t in targets:
            if t in LOWERINGS:
                raise RuntimeError(f"fx target {t} is lowered twice")
            LOWERINGS[t] = fn
        return fn
    return register


def supported_targets() -> list[str]:
    """The fx call targets :func:`load_fx` can lower."""
    return sorted(LOWERINGS)


def target_name(target: Any) -> str:
    """``aten.add.Tensor``, ``operator.getitem``, ``torch.sym_max``… for an fx call target."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return f"{target}.default"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or str(target)
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module.startswith("torch"):
        return f"torch.{name}"
    return f"{module}.{name}" if module else name


# -- entry point ---------------------------------------------------------------------------------

def load_fx(program: "torch.export.ExportedProgram | fx.GraphModule", *, opset: int = DEFAULT_OPSET) -> Graph:
    """Lower a :func:`torch.export.export` program (or the GraphModule it wraps) to the IR.

    ``opset`` is the ONNX opset the lowering mirrors (18 by default; from 20 on
    ``aten.gelu`` becomes a ``Gelu`` node). Raises :class:`UnsupportedOpError` for an
    fx target without a lowering and :class:`ModelError` for programs it cannot read.
    """
    if isinstance(program, torch.export.ExportedProgram):
        gm, signature = program.graph_module, program.graph_signature
        source = "fx:ExportedProgram"
    elif isinstance(program, fx.GraphModule):
        gm, signature = program, None
        source = "fx:GraphModule"
    else:
        raise ModelError(f"load_fx takes a torch.export.ExportedProgram or an fx GraphModule, "
                         f"not a {type(program).__name__}")
    b = Builder(opset)
    outputs: list[str] = []
    inputs: list[ValueInfo] = []
    specs = {}
    if signature is not None:
        specs = {s.arg.name: s for s in signature.input_specs if hasattr(s.arg, "name")}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            spec = specs.get(n.name)
            kind = spec.kind.name if spec is not None else "USER_INPUT"
            if kind == "USER_INPUT":
                inputs.append(b.user_input(n))
            elif kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                b.env[n.name] = b.state(spec.target, _program_tensor(program, spec.target, n.name))
            else:
                raise ModelError(f"fx placeholder {n.name!r} is a {kind} input, which rulegraph does not support")
        elif n.op == "get_attr":
            value = _attribute(gm, n.target)
            if not isinstance(value, Tensor):
                raise ModelError(f"fx node {n.name!r} reads attribute {n.target!r}, a {type(value).__name__}; "
                                 "only tensors are supported")
            b.env[n.name] = b.state(n.target, value)
        elif n.op == "call_function":
            b.call(n)
        elif n.op == "call_module":
            if str(n.target).startswith("_guards"):
                b.env[n.name] = None  # torch.export's input guards
                continue
            raise UnsupportedOpError(f"fx node {n.name!r} calls submodule {n.target!r}; "
                                     "give the program from torch.export (all modules inlined)")
        elif n.op == "call_method":
            raise UnsupportedOpError(f"fx node {n.name!r} calls method {n.target!r}; "
                                     "give the program from torch.export (aten ops only)")
        elif n.op == "output":
            outputs = b.outputs(n, signature)
    nodes = _prune(b.nodes, outputs)
    used = {v for node in nodes for v in node.inputs} | set(outputs)
    constants = {k: v for k, v in b.constants.items() if k in used}
    return Graph(nodes, inputs, outputs, constants, opset=opset, name=b.root_name, source=source)


def _program_tensor(program, target: str, name: str) -> Tensor:
    if target in program.state_dict:
        return program.state_dict[target]
    if target in program.constants:
        value = program.constants[target]
        if isinstance(value, Tensor):
            return value
    raise ModelError(f"fx placeholder {name!r} refers to {target!r}, which the program's state_dict "
                     "and constants do not hold")


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _prune(nodes: list[Node], outputs: list[str]) -> list[Node]:
    """Drop nodes none of whose outputs reach a graph output."""
    live = set(outputs)
    keep = []
    for node in reversed(nodes):
        if any(v in live for v in node.outputs):
            keep.append(node)
            live.update(v for v in node.inputs if v)
    return keep[::-1]


# -- the builder -----------------------------------------------------------------------------------

_MODULE_PATH = [(re.compile(r"^L\['self'\]\.?"), ""), (re.compile(r"^L__self__\.?"), ""),
                (re.compile(r"\._modules\['([^']+)'\]"), r".\1"), (re.compile(r"\[(\d+)\]"), r".\1"),
                (re.compile(r"\['([^']+)'\]"), r".\1")]


def module_scope(node: fx.Node) -> str:
    """The innermost module path in ``node.meta["nn_module_stack"]`` (``""`` at the root)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = str(list(stack.values())[-1][0])
    if path.startswith("_empty_nn_module_stack"):
        return ""
    for pattern, repl in _MODULE_PATH:
        path = pattern.sub(repl, path)
    return path.strip(".")


class Builder:
    """Collects IR nodes and constants while the fx graph is walked.

    ``env`` maps an fx node name to what stands for its result: a value name (``str``),
    a :class:`Sym` for SymInts, a list for tuple results, ``None`` for dropped nodes.
    """

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: list[Node] = []
        self.constants: dict[str, Tensor] = {}
        self.env: dict[str, Any] = {}
        self.used: set[str] = set()
        self.fx: fx.Node | None = None
        self.scope = ""
        self.root_name = ""
        self._transposed: dict[str, str] = {}

    # -- naming and emission ---------------------------------------------------------------------
    def fresh(self, role: str | None) -> str:
        base = self.fx.name if role is None else f"{self.fx.name}.{role}"
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}{k}" if role is not None else f"{base}__{k}"
        self.used.add(name)
        return name

    def emit(self, op: str, inputs: Sequence[str | None], role: str | None = None, *, outputs: int = 1,
             **attrs: Any) -> Any:
        """Add ``op(*inputs, **attrs)``; returns its output name (a list of them when ``outputs > 1``)."""
        name = self.fresh(role)
        outs = (name,) if outputs == 1 else tuple(f"{name}.{i}" for i in range(outputs))
        self.used.update(outs)
        self.nodes.append(Node(name=name, op=op, inputs=tuple(v or "" for v in inputs), outputs=outs,
                               attrs=attrs, scope=self.scope))
        return outs[0] if outputs == 1 else list(outs)

    def const(self, value: Tensor, role: str = "const") -> str:
        name = self.fresh(role)
        self.constants[name] = value
        return name

    def state(self, name: str, value: Tensor) -> str:
        """A parameter, buffer or lifted constant, under its state-dict name."""
        if name in self.used:
            name = f"{name}__{len(self.used)}"
        self.used.add(name)
        self.constants[name] = value.detach()
        return name

    def user_input(self, n: fx.Node) -> ValueInfo:
        val = n.meta.get("val")
        if not isinstance(val, Tensor):
            raise ModelError(f"graph input {n.name!r} is a {type(val).__name__}, not a tensor; "
                             "export with tensor inputs only")
        self.used.add(n.name)
        self.env[n.name] = n.name
        shape = tuple(int(d) if isinstance(d, int) else str(d) for d in val.shape)
        return ValueInfo(n.name, val.dtype, shape)

    # -- walking -----------------------------------------------------------------------------------
    def call(self, n: fx.Node) -> None:
        self.fx = n
        self.scope = module_scope(n)
        if not self.root_name:
            stack = n.meta.get("nn_module_stack") or {}
            first = next(iter(stack.values()), None)
            if first and not str(first[0]).startswith("_empty"):
                self.root_name = str(first[1]).rsplit(".", 1)[-1]
        key = target_name(n.target)
        lower = LOWERINGS.get(key)
        if lower is None:
            raise UnsupportedOpError(
                f"fx node {n.name!r}: target {key} has no lowering in rulegraph's fx loader; "
                f"{choices(LOWERINGS, key)}")
        self.env[n.name] = lower(self, n, bind_args(n))

    def outputs(self, n: fx.Node, signature) -> list[str]:
        flat = torch.utils._pytree.tree_leaves(n.args[0])
        if signature is not None:
            kinds = [s.kind.name for s in signature.output_specs]
            flat = [v for v, k in zip(flat, kinds) if k == "USER_OUTPUT"]
        self.fx, self.scope = n, ""
        names = []
        for i, v in enumerate(flat):
            value = self.env.get(v.name) if isinstance(v, fx.Node) else None
            if not isinstance(value, str) or isinstance(value, Sym):
                raise ModelError(f"graph output {i} is {v!r}, not a tensor computed by the program")
            name = self.env[v.name]
            if name in names or not any(name in node.outputs for node in self.nodes):
                name = self.emit("Identity", [name], f"{i}")  # an input, a constant or a repeated output
            names.append(name)
        return names

    # -- argument helpers ------------------------------------------------------------------------------
    def value(self, a: Any) -> Any:
        if not isinstance(a, fx.Node):
            raise ModelError(f"fx node {self.fx.name!r}: expected a tensor argument, got {a!r}")
        if a.name not in self.env:
            raise ModelError(f"fx node {self.fx.name!r} reads {a.name!r}, which was not computed before it")
        v = self.env[a.name]
        if v is None:
            raise ModelError(f"fx node {self.fx.name!r} reads {a.name!r}, which has no value")
        return v

    def tensor(self, a: Any, dtype: torch.dtype | None = None, role: str = "arg") -> str:
        """``a`` (an fx tensor or SymInt node, or a Python scalar) as a tensor value, cast to ``dtype``."""
        if not isinstance(a, fx.Node):
            if isinstance(a, Tensor):
                t = a.detach()
            else:
                want = dtype or _scalar_dtype(a)
                t = torch.tensor(a, dtype=torch.float64 if want.is_floating_point else want)
                return self.const(t, role)
            return self.const(t if dtype is None else t.to(dtype), role)
        v = self.value(a)
        have = fx_dtype(a)
        if isinstance(v, Sym):
            v = self.emit("Squeeze", [v, self.ints([0], f"{role}_axes")], f"{role}_scalar")
        elif not isinstance(v, str):
            raise ModelError(f"fx node {self.fx.name!r}: argument {a.name!r} is not a tensor")
        if dtype is not None and have != dtype:
            v = self.emit("Cast", [v], f"{role}_cast", to=dtype)
        return v

    def ints(self, values: Sequence[int], role: str) -> str:
        return self.const(torch.tensor(list(values), dtype=INT64), role)

    def int1(self, a: Any, role: str) -> str:
        """An int or SymInt as a 1-element int64 tensor."""
        if isinstance(a, fx.Node):
            v = self.value(a)
            if isinstance(v, Sym):
                return v
            return self.emit("Reshape", [self.tensor(a, INT64, role), self.ints([1], f"{role}_shape")], role)
        return self.ints([int(a)], role)

    def int0(self, a: Any, role: str, dtype: torch.dtype = INT64) -> str:
        """An int or SymInt as a 0-d tensor of ``dtype``."""
        if isinstance(a, fx.Node):
            return self.tensor(a, dtype, role)
        return self.const(torch.tensor(a, dtype=torch.float64 if dtype.is_floating_point else dtype), role)

    def shape(self, items: Sequence[Any], role: str = "shape", *, minus_one_as: int | None = None) -> str:
        """A size list of ints and SymInts as a 1-D int64 tensor (a constant when all are ints)."""
        items = [minus_one_as if (minus_one_as is not None and not isinstance(d, fx.Node) and d == -1) else d
                 for d in items]
        if all(not isinstance(d, fx.Node) for d in items):
            return self.ints([int(d) for d in items], role)
        pieces: list[str] = []
        run: list[int] = []
        for d in items:
            if isinstance(d, fx.Node):
                if run:
                    pieces.append(self.ints(run, f"{role}_part"))
                    run = []
                pieces.append(self.int1(d, f"{role}_part"))
            else:
                run.append(int(d))
        if run:
            pieces.append(self.ints(run, f"{role}_part"))
        return self.emit("Concat", pieces, role, axis=0)

    def dims(self, x: Any, start: int, end: int, role: str) -> str:
        """``Shape(x)[start:end]`` (a constant where those dims are fixed)."""
        sizes = list(fx_val(x).shape)[start:end]
        if all(isinstance(d, int) for d in sizes):
            return self.ints(sizes, role)
        return self.emit("Shape", [self.value(x)], role, start=start, end=end)

    def transposed_weight(self, w: Any) -> str:
        """``Wᵀ`` of a 2-D weight: a new constant ``<name>.T`` when W is one, else a Transpose."""
        name = self.value(w)
        if name in self.constants:
            if name not in self._transposed:
                t_name = f"{name}.T"
                while t_name in self.used:
                    t_name += "_"
                self.used.add(t_name)
                self.constants[t_name] = self.constants[name].t().contiguous()
                self._transposed[name] = t_name
            return self._transposed[name]
        return self.emit("Transpose", [name], "weight_t", perm=[1, 0])


# -- fx metadata -----------------------------------------------------------------------------------

def fx_val(a: Any) -> Any:
    if isinstance(a, fx.Node):
        if "val" not in a.meta:
            raise ModelError(f"fx node {a.name!r} has no meta['val']; give a program from torch.export")
        return a.meta["val"]
    return a


def fx_dtype(a: Any) -> torch.dtype:
    v = fx_val(a)
    if isinstance(v, Tensor):
        return v.dtype
    return _scalar_dtype(v)


def _scalar_dtype(v: Any) -> torch.dtype:
    if isinstance(v, (bool, torch.SymBool)):
        return torch.bool
    if isinstance(v, (int, torch.SymInt)):
        return INT64
    if isinstance(v, (float, torch.SymFloat)):
        return torch.float32
    raise ModelError(f"cannot use {v!r} as a tensor operand")


def rank(a: Any) -> int:
    v = fx_val(a)
    return v.dim() if isinstance(v, Tensor) else 0


def out_dtype(n: fx.Node) -> torch.dtype:
    v = fx_val(n)
    if isinstance(v, Tensor):
        return v.dtype
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], Tensor):
        return v[0].dtype
    return _scalar_dtype(v)


def _dummy(a: Any) -> Any:
    """A stand-in with ``a``'s dtype and rank category, for :func:`torch.result_type`."""
    v = fx_val(a)
    if isinstance(v, Tensor):
        return torch.empty((1,) * v.dim(), dtype=v.dtype)
    if isinstance(v, torch.SymInt):
        return 1
    if isinstance(v, torch.SymFloat):
        return 1.0
    if isinstance(v, torch.SymBool):
        return True
    return v


def common_dtype(x: Any, y: Any) -> torch.dtype:
    """The dtype torch computes ``x ∘ y`` in (type promotion, with 0-d tensors and scalars weaker)."""
    dx, dy = _dummy(x), _dummy(y)
    if not isinstance(dx, Tensor) and not isinstance(dy, Tensor):
        return torch.result_type(torch.tensor(dx), dy)
    return torch.result_type(dx, dy)


def bind_args(n: fx.Node) -> dict[str, Any]:
    """The call's arguments by schema name, with defaults filled in (positional ``arg0…`` otherwise)."""
    schema = getattr(n.target, "_schema", None)
    if schema is None:
        out = {f"arg{i}": a for i, a in enumerate(n.args)}
        out.update(n.kwargs)
        return out
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(n.args) and not arg.kwarg_only:
            out[arg.name] = n.args[i]
        elif arg.name in n.kwargs:
            out[arg.name] = n.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def _axis(d: int, r: int) -> int:
    return d % r if r else 0


def _static(b: Builder, a: Any, what: str) -> int:
    if isinstance(a, fx.Node):
        raise ModelError(f"fx node {b.fx.name!r}: {what} must be a fixed int, got the symbolic {a.name!r}")
    return int(a)


# == the lowering table ===============================================================================

# -- dropped and pass-through ---------------------------------------------------------------------------

@lowers("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.default",
        "aten._assert_async.msg", "aten.sym_constrain_range.default", "aten.sym_constrain_range_for_size.default",
        "aten._functional_sym_constrain_range.default", "aten._functional_sym_constrain_range_for_size.default",
        "aten._functional_assert_async.msg", "aten._functional_assert_scalar.default",
        "aten._check_is_size.default", "torch._check", "torch._check_is_size",
        "torch.sym_constrain_range_for_size", "torch._assert", "torch._assert_async")
def _drop(b: Builder, n: fx.Node, a: dict) -> None:
    return None


@lowers("aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default",
        "aten.feature_alpha_dropout.default", "aten.contiguous.default", "aten.clone.default",
        "aten.alias.default", "aten.detach.default", "aten.detach_.default", "aten.lift_fresh_copy.default",
        "aten.lift_fresh.default")
def _identity(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Identity", [b.value(n.args[0])])


@lowers("aten.view_as.default", "aten.reshape_as.default", "aten.expand_as.default")
def _like_shape(b: Builder, n: fx.Node, a: dict) -> str:
    op = "Expand" if "expand" in str(n.target) else "Reshape"
    return b.emit(op, [b.value(a["self"]), b.dims(a["other"], 0, rank(a["other"]), "shape")])


@lowers("aten.to.dtype", "aten.to.device", "aten.to.dtype_layout", "aten.to.other", "aten._to_copy.default",
        "aten.type_as.default", "aten._to_dim_order_copy.default")
def _to(b: Builder, n: fx.Node, a: dict) -> str:
    x = n.args[0]
    want, have = out_dtype(n), fx_dtype(x)
    if want == have:
        return b.emit("Identity", [b.value(x)])
    return b.emit("Cast", [b.value(x)], to=want)


@lowers("operator.getitem")
def _getitem(b: Builder, n: fx.Node, a: dict) -> Any:
    seq, i = n.args
    v = b.value(seq)
    if not isinstance(v, list):
        raise UnsupportedOpError(f"fx node {n.name!r}: getitem on {seq.name!r}, which is not a tuple result")
    return v[i]


# -- symbolic sizes ---------------------------------------------------------------------------------------

@lowers("aten.sym_size.int")
def _sym_size(b: Builder, n: fx.Node, a: dict) -> Sym:
    x, d = a["self"], _axis(a["dim"], rank(a["self"]))
    return Sym(b.emit("Shape", [b.value(x)], start=d, end=d + 1))


@lowers("aten.sym_numel.default")
def _sym_numel(b: Builder, n: fx.Node, a: dict) -> Sym:
    size = b.emit("Size", [b.value(a["self"])], "size")
    return Sym(b.emit("Reshape", [size, b.ints([1], "shape")]))


def _sym_operand(b: Builder, v: Any, role: str) -> str:
    if isinstance(v, fx.Node):
        return b.int1(v, role)
    if isinstance(v, bool):
        return b.const(torch.tensor([v]), role)
    if isinstance(v, int):
        return b.ints([v], role)
    raise UnsupportedOpError(f"fx node {b.fx.name!r}: symbolic arithmetic on {v!r} (only ints) is not supported")


def _sym_binary(op: str, negate: bool = False):
    def lower(b: Builder, n: fx.Node, a: dict) -> Sym:
        x, y = (_sym_operand(b, v, f"arg{i}") for i, v in enumerate(n.args))
        if negate:
            return Sym(b.emit("Not", [b.emit(op, [x, y], "eq")]))
        return Sym(b.emit(op, [x, y]))
    return lower


for _name, _op in {"add": "Add", "sub": "Sub", "mul": "Mul", "mod": "Mod", "eq": "Equal", "lt": "Less",
                   "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}.items():
    lowers(f"operator.{_name}")(_sym_binary(_op))
lowers("operator.ne")(_sym_binary("Equal", negate=True))
lowers("torch.sym_max")(_sym_binary("Max"))
lowers("torch.sym_min")(_sym_binary("Min"))


@lowers("operator.floordiv")
def _sym_floordiv(b: Builder, n: fx.Node, a: dict) -> Sym:
    x, y = (_sym_operand(b, v, f"arg{i}") for i, v in enumerate(n.args))
    exact = b.emit("Sub", [x, b.emit("Mod", [x, y], "mod")], "sub")   # x - x mod y: exactly divisible
    return Sym(b.emit("Div", [exact, y]))


@lowers("operator.neg")
def _sym_neg(b: Builder, n: fx.Node, a: dict) -> Sym:
    return Sym(b.emit("Neg", [_sym_operand(b, n.args[0], "arg0")]))


@lowers("torch.sym_not", "operator.not_")
def _sym_not(b: Builder, n: fx.Node, a: dict) -> Sym:
    return Sym(b.emit("Not", [_sym_operand(b, n.args[0], "arg0")]))


# -- embeddings, linear layers, products ----------------------------------------------------------------

@lowers("aten.embedding.default")
def _embedding(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Gather", [b.value(a["weight"]), b.value(a["indices"])])


@lowers("aten.linear.default")
def _linear(b: Builder, n: fx.Node, a: dict) -> str:
    x, w, bias = a["input"], a["weight"], a["bias"]
    if rank(x) == 2 and bias is not None:   # what both ONNX exporters emit for 2-D inputs
        return b.emit("Gemm", [b.value(x), b.value(w), b.value(bias)], alpha=1.0, beta=1.0, transB=1)
    wt = b.transposed_weight(w)
    if bias is None:
        return b.emit("MatMul", [b.value(x), wt])
    product = b.emit("MatMul", [b.value(x), wt], "matmul")
    return b.emit("Add", [b.value(bias), product])


@lowers("aten.addmm.default")
def _addmm(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Gemm", [b.value(a["mat1"]), b.value(a["mat2"]), b.value(a["self"])],
                  alpha=float(a["alpha"]), beta=float(a["beta"]))


@lowers("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
def _matmul(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("MatMul", [b.tensor(n.args[0], dtype, "a"), b.tensor(n.args[1], dtype, "b")])


@lowers("aten.einsum.default")
def _einsum(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Einsum", [b.value(t) for t in a["tensors"]], equation=a["equation"])


# -- normalisation, activations, attention ---------------------------------------------------------------

def _layer_norm_inputs(b: Builder, a: dict, x: Any) -> tuple[list[str], int]:
    shape = [_static(b, d, "normalized_shape") for d in a["normalized_shape"]]
    w = a["weight"]
    scale = b.value(w) if w is not None else b.const(torch.ones(shape, dtype=fx_dtype(x)), "scale")
    bias = b.value(a["bias"]) if a["bias"] is not None else None
    return [b.value(x), scale, bias], -len(shape)


@lowers("aten.layer_norm.default")
def _layer_norm(b: Builder, n: fx.Node, a: dict) -> str:
    inputs, axis = _layer_norm_inputs(b, a, a["input"])
    return b.emit("LayerNormalization", inputs, axis=axis, epsilon=float(a["eps"]))


@lowers("aten.native_layer_norm.default")
def _native_layer_norm(b: Builder, n: fx.Node, a: dict) -> list[str]:
    inputs, axis = _layer_norm_inputs(b, a, a["input"])
    return b.emit("LayerNormalization", inputs, outputs=3, axis=axis, epsilon=float(a["eps"]))


@lowers("aten.gelu.default")
def _gelu(b: Builder, n: fx.Node, a: dict) -> str:
    x, approximate = b.value(a["self"]), a["approximate"]
    if b.opset >= 20:
        return b.emit("Gelu", [x], approximate=approximate)
    c = lambda v, role: b.const(torch.tensor(v, dtype=torch.float64), role)  # noqa: E731
    if approximate == "tanh":  # torch.onnx (opset 9-19): ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
        cube = b.emit("Mul", [x, b.emit("Mul", [x, x], "square")], "cube")
        inner = b.emit("Add", [x, b.emit("Mul", [c(0.044715, "kappa"), cube], "kappa_cube")], "add")
        scaled = b.emit("Mul", [c(math.sqrt(2 / math.pi), "beta"), inner], "inner")
        gate = b.emit("Add", [c(1.0, "one"), b.emit("Tanh", [scaled], "tanh")], "gate")
        return b.emit("Mul", [c(0.5, "half"), b.emit("Mul", [x, gate], "mul")])
    erf = b.emit("Erf", [b.emit("Div", [x, c(1.4142135623730951, "sqrt2")], "div")], "erf")
    gate = b.emit("Add", [erf, c(1.0, "one")], "gate")
    return b.emit("Mul", [b.emit("Mul", [x, gate], "mul"), c(0.5, "half")])


@lowers("aten.softmax.int", "aten._softmax.default", "aten.log_softmax.int", "aten._log_softmax.default")
def _softmax(b: Builder, n: fx.Node, a: dict) -> str:
    op = "LogSoftmax" if "log_softmax" in str(n.target) else "Softmax"
    x = b.tensor(a["self"], out_dtype(n), "input")
    return b.emit(op, [x], axis=int(a["dim"]))


@lowers("aten.scaled_dot_product_attention.default")
def _sdpa(b: Builder, n: fx.Node, a: dict) -> str:
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if a.get("enable_gqa"):
        raise UnsupportedOpError(f"fx node {n.name!r}: scaled_dot_product_attention with enable_gqa=True "
                                 "is not supported; repeat the key/value heads before exporting")
    r = rank(q)
    scale = a["scale"]
    if scale is None:
        e = fx_val(q).shape[-1]
        if not isinstance(e, int):
            raise ModelError(f"fx node {n.name!r}: attention head size is symbolic; pass scale= explicitly")
        scale = 1.0 / math.sqrt(e)
    perm = list(range(rank(k)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    key_t = b.emit("Transpose", [b.value(k)], "key_t", perm=perm)
    scores = b.emit("MatMul", [b.value(q), key_t], "scores")
    scores = b.emit("Mul", [scores, b.const(torch.tensor(float(scale), dtype=torch.float64), "scale")], "scaled")
    minus_inf = None
    if mask is not None:
        if fx_dtype(mask) == torch.bool:
            minus_inf = b.const(torch.tensor(-math.inf, dtype=torch.float64), "minus_inf")
            scores = b.emit("Where", [b.value(mask), scores, minus_inf], "masked")
        else:
            scores = b.emit("Add", [scores, b.tensor(mask, fx_dtype(q), "mask")], "masked")
    if a["is_causal"]:
        size = b.emit("Concat", [b.dims(q, r - 2, r - 1, "q_len"), b.dims(k, r - 2, r - 1, "k_len")],
                      "causal_shape", axis=0)
        ones = b.emit("ConstantOfShape", [size], "causal_ones", value=torch.ones(1, dtype=torch.bool))
        causal = b.emit("Trilu", [ones], "causal_mask", upper=0)
        minus_inf = minus_inf or b.const(torch.tensor(-math.inf, dtype=torch.float64), "minus_inf")
        scores = b.emit("Where", [causal, scores, minus_inf], "causal")
    probs = b.emit("Softmax", [scores], "softmax", axis=-1)
    return b.emit("MatMul", [probs, b.value(v)])


# -- elementwise ------------------------------------------------------------------------------------

def _unary(op: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        return b.emit(op, [b.tensor(n.args[0], out_dtype(n), "input")])
    return lower


for _target, _op in {"tanh": "Tanh", "relu": "Relu", "sigmoid": "Sigmoid", "exp": "Exp", "log": "Log",
                     "sqrt": "Sqrt", "neg": "Neg", "abs": "Abs", "erf": "Erf", "floor": "Floor", "ceil": "Ceil",
                     "reciprocal": "Reciprocal", "sign": "Sign"}.items():
    lowers(f"aten.{_target}.default")(_unary(_op))


@lowers("aten.rsqrt.default")
def _rsqrt(b: Builder, n: fx.Node, a: dict) -> str:
    root = b.emit("Sqrt", [b.tensor(a["self"], out_dtype(n), "input")], "sqrt")
    return b.emit("Div", [b.const(torch.tensor(1.0, dtype=torch.float64), "one"), root])


@lowers("aten.silu.default")
def _silu(b: Builder, n: fx.Node, a: dict) -> str:
    x = b.value(a["self"])
    return b.emit("Mul", [x, b.emit("Sigmoid", [x], "sigmoid")])


@lowers("aten.leaky_relu.default")
def _leaky_relu(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("LeakyRelu", [b.value(a["self"])], alpha=float(a["negative_slope"]))


def _operands(b: Builder, n: fx.Node, x: Any, y: Any, dtype: torch.dtype) -> tuple[str, str]:
    return b.tensor(x, dtype, "a"), b.tensor(y, dtype, "b")


def _scaled(b: Builder, y: Any, alpha: Any, dtype: torch.dtype) -> str:
    """``alpha · y`` (just ``y`` for alpha 1)."""
    t = b.tensor(y, dtype, "b")
    if alpha is None or alpha == 1:
        return t
    return b.emit("Mul", [t, b.tensor(alpha, dtype, "alpha")], "alpha_b")


@lowers("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar")
def _add_sub(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    op = "Add" if "add" in str(n.target) else "Sub"
    return b.emit(op, [b.tensor(a["self"], dtype, "a"), _scaled(b, a["other"], a.get("alpha"), dtype)])


@lowers("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("Sub", [b.tensor(a["other"], dtype, "b"), _scaled(b, a["self"], a.get("alpha"), dtype)])


@lowers("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Mul", list(_operands(b, n, a["self"], a["other"], out_dtype(n))))


@lowers("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode",
        "aten.floor_divide.default", "aten.floor_divide.Scalar")
def _div(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    mode = "floor" if "floor_divide" in str(n.target) else a.get("rounding_mode")
    x, y = _operands(b, n, a["self"], a["other"], dtype)
    if mode is None:
        return b.emit("Div", [x, y])
    if mode == "floor":
        if dtype.is_floating_point:
            return b.emit("Floor", [b.emit("Div", [x, y], "div")])
        exact = b.emit("Sub", [x, b.emit("Mod", [x, y], "mod")], "sub")   # x - x mod y, exactly divisible
        return b.emit("Div", [exact, y])
    if not dtype.is_floating_point:      # trunc on integers: ONNX Div
        return b.emit("Div", [x, y])
    raise UnsupportedOpError(f"fx node {n.name!r}: div with rounding_mode='trunc' on floats is not supported")


@lowers("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar")
def _remainder(b: Builder, n: fx.Node, a: dict) -> str:
    fmod = int("fmod" in str(n.target))
    return b.emit("Mod", list(_operands(b, n, a["self"], a["other"], out_dtype(n))), fmod=fmod)


@lowers("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(b: Builder, n: fx.Node, a: dict) -> str:
    return b.emit("Pow", list(_operands(b, n, a["self"], a["exponent"], out_dtype(n))))


@lowers("aten.maximum.default", "aten.minimum.default")
def _max_min(b: Builder, n: fx.Node, a: dict) -> str:
    op = "Max" if "maximum" in str(n.target) else "Min"
    return b.emit(op, list(_operands(b, n, a["self"], a["other"], out_dtype(n))))


@lowers("aten.clamp.default", "aten.clamp.Tensor", "aten.clamp_min.default", "aten.clamp_max.default")
def _clamp(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    lo = a.get("min") if "clamp_max" not in str(n.target) else None
    hi = a.get("max") if "clamp_min" not in str(n.target) else None
    return b.emit("Clip", [b.tensor(a["self"], dtype, "input"),
                           b.tensor(lo, dtype, "min") if lo is not None else None,
                           b.tensor(hi, dtype, "max") if hi is not None else None])


_COMPARE = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}


def _compare(name: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        x, y = a["self"], a["other"]
        dtype = common_dtype(x, y)
        xs, ys = b.tensor(x, dtype, "a"), b.tensor(y, dtype, "b")
        if name == "ne":
            return b.emit("Not", [b.emit("Equal", [xs, ys], "eq")])
        return b.emit(_COMPARE[name], [xs, ys])
    return lower


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    lowers(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_compare(_name))


def _logical(kind: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        dtype = out_dtype(n)
        logical = dtype == torch.bool
        op = {"and": "And", "or": "Or"}[kind] if logical else {"and": "BitwiseAnd", "or": "BitwiseOr"}[kind]
        return b.emit(op, list(_operands(b, n, a["self"], a["other"], dtype)))
    return lower


lowers("aten.__and__.Tensor", "aten.__and__.Scalar", "aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar",
       "aten.logical_and.default")(_logical("and"))
lowers("aten.__or__.Tensor", "aten.__or__.Scalar", "aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar",
       "aten.logical_or.default")(_logical("or"))


@lowers("aten.logical_not.default", "aten.bitwise_not.default")
def _not(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    if "bitwise_not" in str(n.target) and fx_dtype(x) != torch.bool:
        raise UnsupportedOpError(f"fx node {n.name!r}: bitwise_not on {fx_dtype(x)} (only bool) is not supported")
    return b.emit("Not", [b.tensor(x, torch.bool, "input")])


@lowers("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def _where(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("Where", [b.tensor(a["condition"], torch.bool, "condition"),
                            b.tensor(a["self"], dtype, "a"), b.tensor(a["other"], dtype, "b")])


@lowers("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    return b.emit("Where", [b.tensor(a["mask"], torch.bool, "mask"), b.tensor(a["value"], dtype, "value"),
                            b.tensor(a["self"], dtype, "input")])


# -- reductions ----------------------------------------------------------------------------------------

def _reduce(op: str):
    def lower(b: Builder, n: fx.Node, a: dict) -> str:
        x = a["self"]
        dims = a.get("dim")
        dims = [dims] if isinstance(dims, int) else (list(dims) if dims else [])
        keep = int(bool(a.get("keepdim", False)))
        xs = b.tensor(x, out_dtype(n), "input")
        if not dims:
            return b.emit(op, [xs], keepdims=keep)
        axes = [_axis(d, rank(x)) for d in dims]
        return b.emit(op, [xs, b.ints(axes, "axes")], keepdims=keep)
    return lower


lowers("aten.mean.dim", "aten.mean.default")(_reduce("ReduceMean"))
lowers("aten.sum.dim_IntList", "aten.sum.default")(_reduce("ReduceSum"))
lowers("aten.amax.default", "aten.max.default")(_reduce("ReduceMax"))
lowers("aten.amin.default", "aten.min.default")(_reduce("ReduceMin"))


@lowers("aten.any.default", "aten.any.dim", "aten.any.dims", "aten.all.default", "aten.all.dim", "aten.all.dims")
def _any_all(b: Builder, n: fx.Node, a: dict) -> str:
    """``any`` / ``all`` as ReduceMax / ReduceMin over the input cast to int64, cast back to bool."""
    x = a["self"]
    dims = a.get("dim")
    dims = [dims] if isinstance(dims, int) else (list(dims) if dims else [])
    keep = int(bool(a.get("keepdim", False)))
    op = "ReduceMax" if "any" in str(n.target) else "ReduceMin"
    xs = b.emit("Cast", [b.tensor(x, torch.bool, "input")], "int", to=INT64)
    inputs = [xs, b.ints([_axis(d, rank(x)) for d in dims], "axes")] if dims else [xs]
    return b.emit("Cast", [b.emit(op, inputs, "reduce", keepdims=keep)], to=torch.bool)


@lowers("aten.max.dim", "aten.min.dim")
def _max_dim(b: Builder, n: fx.Node, a: dict) -> list[str]:
    big = "max" in str(n.target)
    x, d, keep = a["self"], _axis(a["dim"], rank(a["self"])), int(bool(a["keepdim"]))
    values = b.emit("ReduceMax" if big else "ReduceMin", [b.value(x), b.ints([d], "axes")], "values",
                    keepdims=keep)
    indices = b.emit("ArgMax" if big else "ArgMin", [b.value(x)], "indices", axis=d, keepdims=keep)
    return [values, indices]


@lowers("aten.argmax.default", "aten.argmin.default")
def _argmax(b: Builder, n: fx.Node, a: dict) -> str:
    op = "ArgMax" if "argmax" in str(n.target) else "ArgMin"
    x, d = a["self"], a["dim"]
    if d is None:
        flat = b.emit("Reshape", [b.value(x), b.ints([-1], "flat_shape")], "flat")
        out = b.emit(op, [flat], "flat_index" if a["keepdim"] else None, axis=0, keepdims=0)
        if a["keepdim"]:
            return b.emit("Reshape", [out, b.ints([1] * rank(x), "shape")])
        return out
    return b.emit(op, [b.value(x)], axis=_axis(d, rank(x)), keepdims=int(bool(a["keepdim"])))


@lowers("aten.cumsum.default")
def _cumsum(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    axis = b.const(torch.tensor(_axis(a["dim"], max(rank(x), 1)), dtype=INT64), "axis")
    return b.emit("CumSum", [b.tensor(x, out_dtype(n), "input"), axis])


# -- shapes and routing ---------------------------------------------------------------------------------

@lowers("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.view_copy.default")
def _reshape(b: Builder, n: fx.Node, a: dict) -> str:
    size = a.get("size", a.get("shape"))
    allowzero = int(any(not isinstance(d, fx.Node) and d == 0 for d in size))
    return b.emit("Reshape", [b.value(a["self"]), b.shape(size)], allowzero=allowzero)


@lowers("aten.flatten.using_ints")
def _flatten(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    r = rank(x)
    if r == 0:
        return b.emit("Reshape", [b.value(x), b.ints([1], "shape")])
    start, end = _axis(a["start_dim"], r), _axis(a["end_dim"], r)
    pieces = [b.dims(x, 0, start, "lead"), b.ints([-1], "flat"), b.dims(x, end + 1, r, "trail")]
    return b.emit("Reshape", [b.value(x), b.emit("Concat", pieces, "shape", axis=0)])


@lowers("aten.unflatten.int")
def _unflatten(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    r = rank(x)
    d = _axis(a["dim"], r)
    pieces = [b.dims(x, 0, d, "lead"), b.shape(a["sizes"], "sizes"), b.dims(x, d + 1, r, "trail")]
    return b.emit("Reshape", [b.value(x), b.emit("Concat", pieces, "shape", axis=0)])


@lowers("aten.transpose.int")
def _transpose(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    r = rank(x)
    perm = list(range(r))
    d0, d1 = _axis(a["dim0"], r), _axis(a["dim1"], r)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return b.emit("Transpose", [b.value(x)], perm=perm)


@lowers("aten.permute.default")
def _permute(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Transpose", [b.value(x)], perm=[_axis(d, rank(x)) for d in a["dims"]])


@lowers("aten.t.default", "aten.numpy_T.default")
def _t(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    if rank(x) < 2:
        return b.emit("Identity", [b.value(x)])
    return b.emit("Transpose", [b.value(x)], perm=list(range(rank(x)))[::-1])


@lowers("aten.unsqueeze.default")
def _unsqueeze(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Unsqueeze", [b.value(x), b.ints([_axis(a["dim"], rank(x) + 1)], "axes")])


@lowers("aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims")
def _squeeze(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    shape = list(fx_val(x).shape)
    dims = a.get("dim")
    candidates = list(range(len(shape))) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
    axes = sorted({_axis(d, len(shape)) for d in candidates if shape[_axis(d, len(shape))] == 1})
    if not axes:   # torch squeezes only size-1 dims; the others stay
        return b.emit("Identity", [b.value(x)])
    return b.emit("Squeeze", [b.value(x), b.ints(axes, "axes")])


@lowers("aten.slice.Tensor")
def _slice(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    start = 0 if a["start"] is None else a["start"]
    end = INT64_MAX if a["end"] is None else a["end"]
    return b.emit("Slice", [b.value(x), b.int1(start, "starts"), b.int1(end, "ends"),
                            b.ints([_axis(a["dim"], rank(x))], "axes"), b.int1(a["step"], "steps")])


@lowers("aten.select.int")
def _select(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Gather", [b.value(x), b.int0(a["index"], "index")], axis=_axis(a["dim"], rank(x)))


@lowers("aten.index_select.default")
def _index_select(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("Gather", [b.value(x), b.tensor(a["index"], INT64, "index")], axis=_axis(a["dim"], rank(x)))


@lowers("aten.gather.default")
def _gather(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    return b.emit("GatherElements", [b.value(x), b.tensor(a["index"], INT64, "index")],
                  axis=_axis(a["dim"], rank(x)))


@lowers("aten.index.Tensor")
def _index(b: Builder, n: fx.Node, a: dict) -> str:
    """``x[i0, i1, …]`` with integer index tensors: ``Gather`` for one, ``GatherND`` for several."""
    x, indices = a["self"], list(a["indices"])
    r = rank(x)
    picked = [(p, i) for p, i in enumerate(indices) if i is not None]
    for _, i in picked:
        if fx_dtype(i) in (torch.bool, torch.uint8):
            raise UnsupportedOpError(f"fx node {n.name!r}: indexing with a boolean mask (data-dependent shape) "
                                     "is not supported")
    positions = [p for p, _ in picked]
    if len(picked) == 1:
        p, i = picked[0]
        return b.emit("Gather", [b.value(x), b.tensor(i, INT64, "index")], axis=p)
    # broadcast the index tensors to one shape, stack them on a last axis, GatherND
    idx = [b.tensor(i, INT64, f"index{k}") for k, (_, i) in enumerate(picked)]
    shapes = {tuple(str(d) for d in fx_val(i).shape) for _, i in picked}
    if len(shapes) > 1:
        common = b.emit("Shape", [idx[0]], "bshape")
        for k in range(1, len(idx)):
            common = b.emit("Shape", [b.emit("Expand", [idx[k], common], f"bcast{k}")], f"bshape{k}")
        idx = [b.emit("Expand", [t, common], f"index{k}_b") for k, t in enumerate(idx)]
    stacked = b.emit("Concat", [b.emit("Unsqueeze", [t, b.ints([-1], f"axes{k}")], f"index{k}_u")
                                for k, t in enumerate(idx)], "indices", axis=-1)
    rest = [d for d in range(r) if d not in positions]
    data = b.value(x)
    if positions != list(range(len(positions))):
        data = b.emit("Transpose", [data], "data_t", perm=positions + rest)
    consecutive = positions == list(range(positions[0], positions[-1] + 1))
    if not consecutive or positions[0] == 0:   # torch puts the index dims first
        return b.emit("GatherND", [data, stacked], batch_dims=0)
    gathered = b.emit("GatherND", [data, stacked], "gather_nd", batch_dims=0)
    k = rank(n) - len(rest)   # rank of the broadcast index shape
    lead = positions[0]
    perm = list(range(k, k + lead)) + list(range(k)) + list(range(k + lead, rank(n)))
    return b.emit("Transpose", [gathered], perm=perm)


@lowers("aten.expand.default")
def _expand(b: Builder, n: fx.Node, a: dict) -> str:
    # torch's -1 keeps a dim; ONNX Expand broadcasts both ways, so 1 does the same
    return b.emit("Expand", [b.value(a["self"]), b.shape(a["size"], minus_one_as=1)])


@lowers("aten.repeat.default")
def _repeat(b: Builder, n: fx.Node, a: dict) -> str:
    x, repeats = a["self"], list(a["repeats"])
    v = b.value(x)
    extra = len(repeats) - rank(x)
    if extra > 0:
        v = b.emit("Unsqueeze", [v, b.ints(list(range(extra)), "axes")], "lead")
    return b.emit("Tile", [v, b.shape(repeats, "repeats")])


@lowers("aten.cat.default")
def _cat(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    parts = [b.tensor(t, dtype, f"input{k}") for k, t in enumerate(a["tensors"])]
    return b.emit("Concat", parts, axis=_axis(a["dim"], rank(n)))


@lowers("aten.stack.default")
def _stack(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    d = _axis(a["dim"], rank(n))
    parts = [b.emit("Unsqueeze", [b.tensor(t, dtype, f"input{k}"), b.ints([d], f"axes{k}")], f"input{k}_u")
             for k, t in enumerate(a["tensors"])]
    return b.emit("Concat", parts, axis=d)


def _split_sizes(b: Builder, n: fx.Node, d: int) -> list[int]:
    outs = fx_val(n)
    sizes = [o.shape[d] for o in outs]
    if not all(isinstance(s, int) for s in sizes):
        raise UnsupportedOpError(f"fx node {n.name!r}: split of a symbolic dimension into equal chunks "
                                 "is not supported; use split_with_sizes")
    return sizes


@lowers("aten.split.Tensor", "aten.chunk.default", "aten.tensor_split.sections", "aten.unsafe_split.Tensor")
def _split(b: Builder, n: fx.Node, a: dict) -> list[str]:
    x = a["self"]
    d = _axis(a["dim"], rank(x))
    sizes = _split_sizes(b, n, d)
    return b.emit("Split", [b.value(x), b.ints(sizes, "split")], outputs=len(sizes), axis=d)


@lowers("aten.split_with_sizes.default", "aten.split.sizes")
def _split_with_sizes(b: Builder, n: fx.Node, a: dict) -> list[str]:
    x = a["self"]
    d = _axis(a["dim"], rank(x))
    sizes = a.get("split_sizes", a.get("split_size"))
    return b.emit("Split", [b.value(x), b.shape(sizes, "split")], outputs=len(sizes), axis=d)


@lowers("aten.unbind.int")
def _unbind(b: Builder, n: fx.Node, a: dict) -> list[str]:
    x = a["self"]
    d = _axis(a["dim"], rank(x))
    count = len(fx_val(n))
    pieces = b.emit("Split", [b.value(x), b.ints([1] * count, "split")], "split", outputs=count, axis=d)
    return [b.emit("Squeeze", [p, b.ints([d], f"axes{k}")], f"{k}") for k, p in enumerate(pieces)]


@lowers("aten.tril.default", "aten.triu.default")
def _trilu(b: Builder, n: fx.Node, a: dict) -> str:
    upper = int("triu" in str(n.target))
    return b.emit("Trilu", [b.value(a["self"]), b.int0(a["diagonal"], "k")], upper=upper)


# -- tensor factories -------------------------------------------------------------------------------------

def _fill(b: Builder, n: fx.Node, size: Sequence[Any] | str, value: Any) -> str:
    """A tensor of ``size`` filled with ``value`` in ``n``'s dtype: a constant, or ConstantOfShape."""
    dtype = out_dtype(n)
    store = torch.float64 if dtype.is_floating_point else dtype
    if isinstance(value, fx.Node):
        raise UnsupportedOpError(f"fx node {n.name!r}: a fill value computed in the graph is not supported")
    if not isinstance(size, str) and all(not isinstance(d, fx.Node) for d in size):
        return _named_const(b, torch.full([int(d) for d in size], value, dtype=store))
    shape = size if isinstance(size, str) else b.shape(size)
    return b.emit("ConstantOfShape", [shape], value=torch.tensor([value], dtype=store))


def _named_const(b: Builder, value: Tensor) -> str:
    """A constant standing for the fx node's whole result, under its name."""
    name = b.fresh(None)
    b.constants[name] = value
    return name


@lowers("aten.zeros.default", "aten.ones.default", "aten.empty.memory_format", "aten.full.default",
        "aten.new_zeros.default", "aten.new_ones.default", "aten.new_empty.default", "aten.new_full.default")
def _factory(b: Builder, n: fx.Node, a: dict) -> str:
    name = str(n.target)
    value = a.get("fill_value", 1 if "ones" in name else 0)
    return _fill(b, n, a["size"], value)


@lowers("aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default", "aten.full_like.default")
def _factory_like(b: Builder, n: fx.Node, a: dict) -> str:
    x = a["self"]
    value = a.get("fill_value", 1 if "ones" in str(n.target) else 0)
    shape = list(fx_val(x).shape)
    if all(isinstance(d, int) for d in shape):
        return _fill(b, n, shape, value)
    return _fill(b, n, b.emit("Shape", [b.value(x)], "shape"), value)


@lowers("aten.scalar_tensor.default")
def _scalar_tensor(b: Builder, n: fx.Node, a: dict) -> str:
    if isinstance(a["s"], fx.Node):
        return b.emit("Identity", [b.tensor(a["s"], out_dtype(n), "value")])
    return _fill(b, n, [], a["s"])


@lowers("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(b: Builder, n: fx.Node, a: dict) -> str:
    dtype = out_dtype(n)
    start, end, step = a.get("start", 0), a["end"], a.get("step", 1)
    if not any(isinstance(v, fx.Node) for v in (start, end, step)):
        return _named_const(b, torch.arange(start, end, step, dtype=dtype))
    return b.emit("Range", [b.int0(start, "start", dtype), b.int0(end, "limit", dtype), b.int0(step, "delta", dtype)])
