"""The machinery every lowering uses: the table :data:`LOWERINGS` and its decorator
:func:`lowers`, the :class:`Builder` that collects IR nodes and constants while the fx
graph is walked (naming, emission, argument conversion), and the helpers that read fx
metadata (``meta["val"]`` dtypes and ranks, schema-bound arguments, module scopes).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from ...errors import ModelError, UnsupportedOpError, choices
from ...ir import Node, ValueInfo

Tensor = torch.Tensor
INT64 = torch.int64
INT64_MAX = 2**63 - 1


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
                self.constants[t_name] = self.constants[name].t()      # a view: the weight is held once
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
