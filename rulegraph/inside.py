"""Relevance inside the model: at chosen values (``--at``), per position and unit (heads split out for
attention), and conditioned on chosen units (``--condition``, Concept Relevance Propagation).

**Selecting values.** A selector names values the way a rule file names nodes
(:mod:`rulegraph.ruleset.match`), optionally restricted to transformer blocks as ``per_layer:
{blocks: …}`` does (:meth:`~rulegraph.ir.Graph.block_of`)::

    SELECTOR := ["every"] [BLOCKS] WHAT
    BLOCKS   := "block" N | "block" N-M | "blocks" N,M,…
    WHAT     := SITE                          a named site (:data:`SITES`): attention output, MLP activation,
                                              block output
              | KEY GLOB[,GLOB…]              KEY one of op, trait, name, scope: a rule-file entry's key, matched
                                              by :class:`~rulegraph.ruleset.match.Entry` (op types, op traits,
                                              node-name and scope globs); the node's first output is selected
              | NAME                          a node's name (its first output) or a value's name

``every`` reads as nothing (all blocks unless ``BLOCKS`` narrows them): ``every MLP activation``,
``block 1 attention output``, ``block 0-1 op Softmax``, ``scope *.intermediate.dense``, ``/conv2/Conv``.
A selector that matches nothing is refused with the blocks and sites the graph has; one that matches more
than :data:`MAX_VALUES` values too.

**Units.** The relevance at a value is returned whole (``[batch, …]``) and per unit: for an attention
output (the heads' outputs concatenated, before the output projection mixes them, as the attention
blocks of :mod:`rulegraph.heads` find them) ``[batch, positions, heads, head_dim]``, the head count
read off the graph's shapes (:func:`rulegraph.heads.find_heads`); for a convolution's ``[batch,
channels, rows, columns]`` the channels; otherwise the last axis (an MLP's neurons, ``[batch,
positions, neurons]``).

**Conditional relevance** (Achtibat et al. 2023, "From attribution maps to human-understandable
explanations through Concept Relevance Propagation", Nature Machine Intelligence: the message
``R_{i←j}(x | θ) = (z_ij / z_j) · Σ_{c∈θ} δ_{jc} · R_j(x | θ)`` of a conditioned layer): at the
selected values, the relevance arriving is multiplied by a mask θ over the units,
``R_θ = R ⊙ 1[unit ∈ θ]``, before the producing node's rule hands it on; the walk goes on with
``R_θ`` alone, so the input map shows what the chosen units contributed. ``R − R_θ`` is booked in the
audit as absorbed at that node (by the condition), so the ledger still adds up:
``output = inputs + absorbed + breaks``. A signal ``R = x ⊙ g`` is masked as ``x ⊙ (g ⊙ 1[θ])``, the
same numbers. Since the mask is linear in the relevance and every rule is linear in the relevance
arriving at its outputs, conditions on disjoint unit sets of a cut (a value every path to the inputs
passes: a block output) add up to the unconditioned map; at a value a residual path bypasses (an
attention output) each conditioned map keeps the bypassing relevance, as zennit-crp's masks do.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .errors import InputError, ModelError, choices
from .ir import Graph, Node
from .registry import Registry

Tensor = torch.Tensor

#: the most values one selector may select (``--at``, ``--condition``)
MAX_VALUES = 64
#: the most maps one explanation's conditions make (alternatives ``|``, ``each``)
MAX_MAPS = 64
#: the rule-file keys a selector takes (:class:`rulegraph.ruleset.match.Entry`'s fields)
KEYS = {"op": "ops", "trait": "traits", "name": "names", "scope": "scopes"}
#: the unit kinds a condition names (``PATTERN:KIND=…``): all but ``heads`` mean the value's unit axis
UNIT_KINDS = ("heads", "neurons", "channels", "units")


@dataclass(frozen=True)
class Site:
    """A named site: what values it selects in a graph (node, value), and how it is described."""

    help: str
    find: Callable[[Graph], list[tuple[Node, str]]]


#: named sites, as a selector names them (lowercase)
SITES: Registry[Site] = Registry("site", InputError)


def _attention_outputs(graph: Graph) -> list[tuple[Node, str]]:
    """Each attention block's heads concatenated: the value product's output followed forward through
    the routing ops that merge its heads (a Transpose, then the Reshape to ``[batch, positions,
    heads·head_dim]``), before the output projection."""
    from .heads import attention_nodes
    from .ops import find
    found = []
    for _, product in attention_nodes(graph):
        node, value = product, product.outputs[0]
        for _ in range(8):          # the readers of its values, but for those reading a shape (Shape, Size)
            readers = [n for n, _ in graph.consumers.get(value, [])
                       if not getattr(find(n.op, n.domain), "shape_only", False)]
            spec = find(readers[0].op, readers[0].domain) if len(readers) == 1 else None
            if spec is None or not spec.routing:
                break
            node, value = readers[0], readers[0].outputs[0]
            if node.op in ("Reshape", "Flatten"):       # the heads merged (a projection may flatten positions next)
                break
        found.append((node, value))
    return found


def _mlp_activations(graph: Graph) -> list[tuple[Node, str]]:
    """In a transformer block, an activation op that is not a sigmoidal gate (Relu, Gelu…), or the product
    of a value and its gate (x · ½(1 + erf(x/√2)), x · σ(x): :data:`rulegraph.patterns.GATE`)."""
    from .ops import find
    from .patterns import GATE
    found = []
    for n in graph.nodes:
        if graph.block_of(n) is None or not n.outputs:
            continue
        spec = find(n.op, n.domain)
        gated = n.op == "Mul" and any(v and GATE.matches(graph, v) for v in n.inputs)
        if gated or (spec is not None and spec.activation and not spec.sigmoidal):
            found.append((n, n.outputs[0]))
    return found


def _block_outputs(graph: Graph) -> list[tuple[Node, str]]:
    """The residual stream each block hands on (:func:`rulegraph.stream.hidden_states`, past ``h_0``)."""
    from .stream import hidden_states
    return [(graph.producer[v], v) for v in hidden_states(graph)[1:]]


SITES.add("attention output", Site("each attention's heads concatenated, before the output projection "
                                   "([batch, positions, heads, head_dim])", _attention_outputs))
SITES.add("mlp activation", Site("each block's MLP activation ([batch, positions, neurons])", _mlp_activations))
SITES.add("block output", Site("the residual stream each block hands on ([batch, positions, hidden])",
                               _block_outputs))


@dataclass(frozen=True)
class Selector:
    """A parsed selector (see the module doc)."""

    text: str
    blocks: frozenset[int] | None = None
    site: str | None = None
    key: str | None = None
    globs: tuple[str, ...] = ()
    name: str | None = None

    def select(self, graph: Graph) -> list[tuple[Node, str]]:
        """The (producer, value) pairs selected, in graph order; refused where there are none or too many."""
        from .ruleset.match import Entry, Override
        if self.site is not None:
            try:
                found = SITES.get(self.site).find(graph)
            except ModelError as error:      # a site the graph lacks the parts of (no blocks)
                raise InputError(f"{self.text!r}: {error}") from None
        elif self.key is not None:
            from .ops import TRAITS
            unknown = [t for t in self.globs if t not in TRAITS] if self.key == "trait" else []
            if unknown:
                raise InputError(f"{self.text!r}: no op trait {unknown[0]!r}; {choices(TRAITS, unknown[0])}")
            entry = Entry(rule=None, line=0, **{KEYS[self.key]: self.globs})
            found = [(n, n.outputs[0]) for n in graph.nodes if n.outputs and n.outputs[0] and entry.matches(graph, n)]
        elif self.name in graph.producer:
            found = [(graph.producer[self.name], self.name)]
        else:
            node = next((n for n in graph.nodes if n.name == self.name), None)
            found = [(node, node.outputs[0])] if node is not None and node.outputs else []
        if self.blocks is not None:
            within = Override(rule=None, line=0, blocks=self.blocks)
            found = [(n, v) for n, v in found if within.matches(n)]
        if not found:
            blocks = sorted({b for n in graph.nodes if (b := graph.block_of(n)) is not None})
            shown = f"blocks {blocks[0]}–{blocks[-1]}" if blocks else "no numbered blocks"
            ops = f"; the graph's ops: {', '.join(sorted(graph.op_types()))}" if self.key == "op" else ""
            raise InputError(f"{self.text!r} selects no value of the graph ({shown}); a selector is "
                             f"[every] [block N|N-M] WHAT, WHAT a site ({', '.join(SITES.names())}), "
                             f"{' / '.join(KEYS)} GLOB, or a node or value name{ops}")
        if len(found) > MAX_VALUES:
            raise InputError(f"{self.text!r} selects {len(found)} values; at most {MAX_VALUES} — narrow it "
                             "(block N, a site, a name glob)")
        return found


_BLOCKS = re.compile(r"^blocks?\s+(\d+(?:\s*-\s*\d+)?(?:\s*,\s*\d+(?:\s*-\s*\d+)?)*)\s*(.*)$", re.I)


def _numbers(text: str) -> list[int]:
    """``0,2,5-7`` → [0, 2, 5, 6, 7]."""
    out = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.strip().isdigit() or (high and not high.strip().isdigit()):
            raise InputError(f"{text!r}: expected numbers and ranges such as 0,2,5-7")
        a, b = int(low), int(high) if high else int(low)
        if b < a or b - a > 1 << 16:
            raise InputError(f"{text!r}: the range {part.strip()} is empty or too long")
        out.extend(range(a, b + 1))
    return out


def parse(text: str) -> Selector:
    """A selector's text (see the module doc) parsed."""
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"a selector is a non-empty string, got {text!r}")
    rest = text.strip()
    rest = re.sub(r"^every\s+", "", rest, flags=re.I)
    blocks = None
    m = _BLOCKS.match(rest)
    if m:
        blocks, rest = frozenset(_numbers(m.group(1))), m.group(2).strip()
    if rest.lower() in SITES.names():
        return Selector(text, blocks, site=rest.lower())
    key, _, globs = rest.partition(" ")
    if key.lower() in KEYS and globs.strip():
        return Selector(text, blocks, key=key.lower(), globs=tuple(g.strip() for g in globs.split(",") if g.strip()))
    if not rest:
        raise InputError(f"{text!r}: say what to select after the blocks (a site: {', '.join(SITES.names())})")
    return Selector(text, blocks, name=rest)


def head_counts(graph: Graph) -> dict[str, int]:
    """Attention output value → its block's head count (read off the shapes, :func:`rulegraph.heads.find_heads`)."""
    from .heads import attention_nodes, find_heads
    counts = {b.product: b.heads for b in find_heads(graph)}
    return {value: counts[product.name] for (_, product), (_, value) in zip(attention_nodes(graph),
                                                                            _attention_outputs(graph))
            if product.name in counts}


def unit_axis(shape: tuple[int, ...]) -> int:
    """The axis of a value's units: a convolution's channels (axis 1 of 4-D or 5-D), else the last."""
    return 1 if len(shape) in (4, 5) else len(shape) - 1


@dataclass
class Inside:
    """The relevance arriving at one selected value (after any condition there), per position and unit."""

    selector: str
    value: str
    node: str
    block: int | None
    relevance: Tensor                 # in :attr:`axes`: heads split out for an attention output
    axes: tuple[str, ...]

    @property
    def heads(self) -> int | None:
        return self.relevance.shape[self.axes.index("head")] if "head" in self.axes else None

    def total(self) -> Tensor:
        """Σ R per batch item (float64)."""
        return self.relevance.double().flatten(1).sum(1)

    def per_unit(self) -> Tensor:
        """``[batch, units]``: summed over every other axis (heads: per head; a convolution: per channel)."""
        axis = self.axes.index("head") if "head" in self.axes else self.axes.index("channel") \
            if "channel" in self.axes else len(self.axes) - 1
        r = self.relevance.double().movedim(axis, 1)
        return r.flatten(2).sum(2) if r.dim() > 2 else r

    def per_position(self) -> Tensor | None:
        """``[batch, positions]``, where the value has positions."""
        if "position" not in self.axes:
            return None
        r = self.relevance.double().movedim(self.axes.index("position"), 1)
        return r.flatten(2).sum(2)

    def __repr__(self) -> str:
        where = f"block {self.block}, " if self.block is not None else ""
        shape = " × ".join(f"{n} {a}" for n, a in zip(self.relevance.shape, self.axes))
        return f"Inside({self.value!r}: {where}{shape}, Σ {[round(float(t), 6) for t in self.total()]})"

    def item(self, i: int) -> Inside:
        return Inside(self.selector, self.value, self.node, self.block, self.relevance[i:i + 1], self.axes)

    def to_dict(self) -> dict[str, Any]:
        d = {"value": self.value, "node": self.node, "block": self.block, "axes": list(self.axes),
             "shape": list(self.relevance.shape), "total": self.total().tolist(),
             ("per_head" if self.heads else "per_unit"): self.per_unit().tolist()}
        positions = self.per_position()
        if positions is not None:
            d["per_position"] = positions.tolist()
        d["relevance"] = self.relevance.tolist()
        return d


def _view(r: Tensor, heads: int | None) -> tuple[Tensor, tuple[str, ...]]:
    if heads and r.dim() == 3 and r.shape[-1] % heads == 0:
        return r.reshape(*r.shape[:-1], heads, r.shape[-1] // heads), ("batch", "position", "head", "dim")
    named = {2: ("batch", "unit"), 3: ("batch", "position", "unit"), 4: ("batch", "channel", "row", "column")}
    return r, named.get(r.dim(), ("batch", *(f"axis{i}" for i in range(1, r.dim()))))


@dataclass(frozen=True)
class Units:
    """A condition's units: ``kind`` (:data:`UNIT_KINDS`) and their indices."""

    kind: str
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Choice:
    """A condition as given: its selector and its units' alternatives, each a map of its own
    (``heads=0|1,2``: two maps; ``each``: one map per unit, counted once the forward has run)."""

    selector: str
    kind: str
    alternatives: tuple[tuple[int, ...], ...] | None        # None: ``each`` unit

    def units(self, count: int | None = None) -> list[Units]:
        """The alternatives as :class:`Units` (``count``: the value's units, for ``each``)."""
        found = self.alternatives if self.alternatives is not None else tuple((i,) for i in range(count or 0))
        return [Units(self.kind, indices) for indices in found]

    def text(self, units: Units) -> str:
        """One alternative written as a condition of one map."""
        return f"{self.selector}:{self.kind}={','.join(map(str, units.indices)) or 'none'}"


def parse_condition(text: str) -> tuple[Selector, Choice]:
    """``SELECTOR:KIND=0,2,5-9`` (KIND one of :data:`UNIT_KINDS`; ``KIND=none``: no unit, the relevance
    that bypasses the value alone) parsed; ``KIND=0|1,2`` gives alternatives, each a map of its own, and
    ``KIND=each`` a map per unit."""
    if not isinstance(text, str) or ":" not in text:
        raise InputError(f"a condition is SELECTOR:KIND=N[,M|N-M…] (KIND: {', '.join(UNIT_KINDS)}), e.g. "
                         f"'block 1 attention output:heads=0,2'; got {text!r}")
    selector, _, units = text.rpartition(":")
    kind, _, numbers = units.strip().partition("=")
    if kind.strip().lower() not in UNIT_KINDS or not numbers.strip():
        raise InputError(f"condition {text!r}: the units are KIND=N[,M|N-M…]; {choices(UNIT_KINDS, kind.strip())}")
    spec = numbers.strip().lower()
    alternatives = None if spec == "each" else tuple(
        () if part.strip() == "none" else tuple(sorted(set(_numbers(part)))) for part in spec.split("|"))
    if alternatives is not None and len(alternatives) > MAX_MAPS:
        raise InputError(f"condition {text!r}: {len(alternatives)} alternatives; the limit is {MAX_MAPS} maps")
    return parse(selector), Choice(selector.strip(), kind.strip().lower(), alternatives)


@dataclass
class Conditions:
    """The masks of one map's conditions, by value; :meth:`apply` is the walk's hook where relevance
    arrives at a node's outputs (:class:`rulegraph.passes.relevance.RelevanceWalk`). ``given``: the masks
    made beforehand (:meth:`mask` of each map, stacked for the batched walk, which maps over them)."""

    masks: dict[str, tuple[Units, int | None]] = field(default_factory=dict)    # value → (units, head count)
    described: list[str] = field(default_factory=list)     # the conditions of this map, as a user writes them
    given: dict[str, Tensor] | None = None

    def mask(self, value: str, x: Tensor) -> Tensor:
        """1 at the chosen units of ``value`` (shaped to broadcast over ``x``), 0 elsewhere."""
        if self.given is not None:
            return self.given[value]
        units, heads = self.masks[value]
        axis, width = unit_axis(tuple(x.shape)), units_of(value, x, units.kind, heads)
        keep = torch.zeros(width, dtype=x.dtype, device=x.device)
        keep[list(units.indices)] = 1
        if units.kind == "heads":
            keep = keep.repeat_interleave(x.shape[axis] // heads)
        shape = [1] * x.dim()
        shape[axis] = x.shape[axis]
        return keep.reshape(shape)

    def fixed(self, given: dict[str, Tensor]) -> Conditions:
        """These conditions with their masks ``given`` (one map's, or under vmap each map's in turn)."""
        return Conditions(self.masks, self.described, given)

    def apply(self, outputs: tuple[str, ...], arriving: list, ledger: Any) -> tuple[list, list[int]]:
        """``arriving`` (an ``Incoming`` per output) with the masked values' relevance kept at the chosen
        units, and the ledger entries (when auditing) of the rest."""
        from .propagation.signal import Incoming
        out, booked = list(arriving), []
        for k, (v, a) in enumerate(zip(outputs, arriving)):
            if a is None or v not in self.masks:
                continue
            m = self.mask(v, a.value)
            kept, dropped = Incoming(a.value), Incoming(a.value)
            if a.explicit is not None:
                kept.explicit, dropped.explicit = a.explicit * m, a.explicit * (1 - m)
            else:
                kept.signal, dropped.signal = a.signal * m, a.signal * (1 - m)
            if ledger is not None:
                booked.append(ledger.arriving(dropped))
            out[k] = kept
        return out, booked

    def describe(self, absorbed: float | None) -> dict[str, Any]:
        return {"conditions": self.described, "values": sorted(self.masks), "absorbed": absorbed,
                "note": "the relevance the condition masks out is booked as absorbed at the conditioned nodes"}


def units_of(value: str, x: Tensor, kind: str, heads: int | None) -> int:
    """How many units of ``kind`` the value ``value`` (``x``) has: its heads, or the length of its unit axis."""
    width = x.shape[unit_axis(tuple(x.shape))]
    if kind != "heads":
        return width
    if not heads or width % heads:
        raise InputError(f"condition on {value!r}: heads= needs an attention output (the value has no heads "
                         "rulegraph can split out); use units= / neurons=")
    return heads


@dataclass
class Request:
    """What an explanation asks of the inside: values to read (``at``) and conditions, with their values."""

    at: dict[str, list[tuple[Node, str]]] = field(default_factory=dict)     # selector → selected
    choices: list[tuple[Choice, list[str]]] = field(default_factory=list)   # each condition and its values
    heads: dict[str, int] = field(default_factory=dict)

    @property
    def values(self) -> frozenset[str]:
        return frozenset(v for found in self.at.values() for _, v in found)

    @property
    def several(self) -> bool:
        """Whether the conditions make more than one map (alternatives, ``each``)."""
        return any(c.alternatives is None or len(c.alternatives) > 1 for c, _ in self.choices)

    def maps(self, value: Callable[[str], Tensor]) -> list[Conditions]:
        """One :class:`Conditions` per map: every combination of the conditions' alternatives (none without
        conditions); ``value(name)`` gives a conditioned value (for ``each``'s count and the units' range)."""
        if not self.choices:
            return []
        options = []
        for choice, values in self.choices:
            counts = {units_of(v, value(v), choice.kind, self.heads.get(v)) for v in values}
            if choice.alternatives is None and len(counts) > 1:
                raise InputError(f"condition {choice.selector!r}:{choice.kind}=each: the values it selects have "
                                 f"{sorted(counts)} {choice.kind}; select values with one count")
            units = choice.units(min(counts))
            for u in units:
                if u.indices and u.indices[-1] >= min(counts):
                    raise InputError(f"condition on {values[0]!r}: {u.kind} {u.indices[-1]} is out of range; "
                                     f"it has {min(counts)} {u.kind} (0…{min(counts) - 1})")
            options.append([(choice, values, u) for u in units])
        total = math.prod(len(o) for o in options)
        if total > MAX_MAPS:
            raise InputError(f"the conditions make {total} maps; the limit is {MAX_MAPS}")
        return [Conditions({v: (u, self.heads.get(v)) for c, values, u in combo for v in values},
                           [c.text(u) for c, _, u in combo]) for combo in itertools.product(*options)]

    def read(self, recorded: dict[str, Tensor], values: Any) -> dict[str, list[Inside]]:
        """Per selector, each selected value's :class:`Inside` (zeros where no relevance arrived)."""
        out = {}
        for selector, found in self.at.items():
            items = []
            for node, v in found:
                r = recorded.get(v)
                if r is None:
                    r = torch.zeros_like(values[v]) if v in values else torch.zeros(0)
                r, axes = _view(r.detach().cpu(), self.heads.get(v))
                items.append(Inside(selector, v, node.name, node_block(node), r, axes))
            out[selector] = items
        return out


def node_block(node: Node) -> int | None:
    from .ir import block_of
    return block_of(node)


def request(graph: Graph, binding: Any, at: str | list[str] | None, condition: str | list[str] | None) -> Request:
    """The values ``at`` selects and the conditions ``condition`` asks for, checked against ``graph`` and the
    rule set's ``binding`` (a condition needs a value whose producer the walk visits)."""
    req = Request()
    for text in _listed(at, "at"):
        req.at[text] = parse(text).select(graph)
    conditions = _listed(condition, "condition")
    reached = {v for n in binding.reached if n.name in binding.assignments for v in n.outputs} if conditions else set()
    for text in conditions:
        selector, choice = parse_condition(text)
        found = [(n, v) for n, v in selector.select(graph)]
        walked = [v for n, v in found if v in reached and v not in binding.boundary]
        if not walked:
            raise InputError(f"condition {text!r}: no relevance passes {found[0][1]!r} under this rule set "
                             "(no rule reaches its producer, or it is the input boundary)")
        req.choices.append((choice, walked))
    total = math.prod(len(c.alternatives) for c, _ in req.choices if c.alternatives is not None)
    if total > MAX_MAPS:
        raise InputError(f"the conditions make {total} maps; the limit is {MAX_MAPS}")
    asked = req.values | {v for _, values in req.choices for v in values}
    if asked and asked & {v for _, v in _attention_outputs(graph)}:      # heads to split out: read their count
        req.heads = head_counts(graph)
    return req


def map_count(condition: str | list[str] | None) -> int | None:
    """How many maps ``condition`` makes, from its text alone (1 without ``|`` alternatives; ``None`` with
    ``each``: its units are counted once the forward has run)."""
    found = [parse_condition(text)[1] for text in _listed(condition, "condition")]
    if any(c.alternatives is None for c in found):
        return None
    return math.prod(len(c.alternatives) for c in found)


def several(condition: str | list[str] | None) -> bool:
    """Whether ``condition`` makes more than one map (``|`` alternatives, ``each``)."""
    return map_count(condition) != 1


def _listed(given: str | list[str] | None, what: str) -> list[str]:
    if given is None:
        return []
    items = [given] if isinstance(given, str) else list(given)
    if not all(isinstance(t, str) for t in items):
        raise InputError(f"{what} takes a selector string or a list of them, got {given!r}")
    return items


def lines(e: Any, item: int = 0) -> list[str]:
    """What ``rulegraph explain --at`` prints: per selected value its total, per head or per unit (the
    strongest), and the condition's absorbed relevance."""
    out = []
    for selector, found in (e.inside or {}).items():
        out.append(f"relevance at {selector!r}:")
        for x in found:
            where = f"block {x.block}" if x.block is not None else x.node
            units = x.per_unit()[item]
            if x.heads:
                shown = "heads " + " ".join(f"{i}:{float(u):+.3g}" for i, u in enumerate(units))
            else:
                top = sorted(range(units.numel()), key=lambda i: -abs(float(units[i])))[:5]
                shown = f"{x.axes[-1] if x.axes[-1] != 'column' else 'channel'}s (strongest) " + \
                    " ".join(f"{i}:{float(units[i]):+.3g}" for i in top)
            out.append(f"  {where:<10} {x.value}  Σ {float(x.total()[item]):+.4g}   {shown}")
    if e.extra.get("condition"):
        c = e.extra["condition"]
        masked = "" if c["absorbed"] is None else f" {c['absorbed']:+.4g} masked out,"
        out.append(f"conditioned on {'; '.join(c['conditions'])}:{masked} booked as absorbed at the conditioned nodes "
                   "(the audit still adds up)")
    return out
