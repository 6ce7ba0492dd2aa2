"""The decomposition pass: a forward walk that carries G+1 components per value (Yang et al. 2023,
"Local interpretation of transformer based on linear decomposition", ACL, Sec. 2).

After the ordinary forward (every value by name), the values the boundary reads are
split by the partition: group g gets the rows of its positions (dim 1), the bias
component nothing (Eq. 14). The partition's positions are the *rows* of :class:`Rows`: an
encoder–decoder's source tokens followed by its target prefix (the decoder's inputs have a
sequence axis of their own), so a group can be the source or the prefix (Yang et al. 2023,
Sec. 4.2). Then, in topological order, each node the rule set
reaches maps the components of its inputs to those of its outputs with its rule
(:mod:`rulegraph.propagation.components`). Values that carry no components — weights,
biases, position embeddings, masks, attention probabilities, LayerNorm statistics —
are constants or coefficients of the node that reads them.

Components are kept as a ``[G, *shape]`` tensor plus the bias ``[*shape]``, freed
after their last reader, so memory is about (G+1)× the largest live activations;
elementwise rules work on the group components in chunks to bound temporaries.

The audit checks, at every node, that Σ components equals the forward value, and
reports the largest error per node and per layer (``graph.layers``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Sequence

import torch

from ..boundary import BoundaryMap, Mapped
from ..audit import Audit, Conservation, LayerAudit, NodeAudit
from ..errors import InputError, NumericalError, RuleMatchError
from ..explanation import Explanation
from ..interpreter import Values
from ..ir import Node
from ..lifetimes import StepLife, Walker, deaths, sole_owner
from ..propagation.components import ComponentSite, GroupSums, Parts
from ..ruleset import Binding
from ..tolerances import relative, tolerance
from .base import PASSES, Forward, Pass, forward, prepared, rule_failed
from .partition import Partition, assign

Tensor = torch.Tensor

#: elements per chunk of group components in elementwise rules (bounds temporaries)
CHUNK_ELEMENTS = 1 << 25


@dataclass
class LayerReconstruction:
    """Largest |Σ components − forward value| over a layer's nodes, absolute and relative
    to the node's largest |value|."""

    name: str
    nodes: int = 0
    max_abs_error: float = 0.0
    max_relative_error: float = 0.0
    worst_node: str = ""


@dataclass
class DecompositionAudit(Audit):
    """The relevance :class:`~rulegraph.audit.Audit` shape, plus the reconstruction table.

    ``conservation``: the explained output = Σ group contributions (``input_total``) +
    the bias component (``absorbed``) + ``residual``; ``breaks`` is always 0. Per node,
    ``error`` is the largest elementwise |Σ components − value| and ``relative_error`` that
    over the largest |value|; the relevance fields of a node or layer (``relevance_in``,
    ``relevance_out``, ``absorbed``, ``breaks``) are 0, since components, not relevance, flow.
    """

    reconstruction: list[LayerReconstruction] = field(default_factory=list)

    @property
    def max_relative_error(self) -> float:
        return max((layer.max_relative_error for layer in self.reconstruction), default=0.0)

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["reconstruction"] = [asdict(layer) for layer in self.reconstruction]
        return d


@dataclass
class Components:
    """Every component the pass computed: the result of :func:`components`."""

    forward: Forward
    partitions: list[Partition]
    rows: "Rows"
    parts: dict[str, Parts]                      # components of the values kept (the outputs, or all)
    errors: dict[str, tuple[Tensor, Tensor]]     # node → (max abs error, max |value|)
    stranded: list[str] = field(default_factory=list)
    settings: dict = field(default_factory=dict)   # the activation params in effect (first activation reached)
    leaves: dict[str, Tensor] = field(default_factory=dict)   # the boundary values, in the linearized pass

    @property
    def binding(self) -> Binding:
        return self.forward.binding

    @property
    def env(self) -> Values:
        return self.forward.values


def components(forward: Forward, *, groups: Any = "token", word_ids: Sequence[Sequence[int | None]] | None = None,
               tokens: Sequence[Sequence[str]] | None = None, alpha: str | None = None,
               threshold: float | None = None, variant: str | None = None, audit: bool = True,
               keep: bool = False, linearized: bool = False) -> Components:
    """The decomposition pass after the prologue's forward. ``keep=True`` keeps every value's
    components (for tests and inspection); otherwise only the graph outputs' are kept.

    ``linearized=True`` carries one group (all positions) whose boundary values are
    autograd leaves (``Components.leaves``): with signed α or D̄ every rule is linear in the
    group components once its factors are fixed, so the contribution of any group is
    ``Σ_{i∈g} x_i · ∂D(y)/∂x_i`` (Group Additivity, Yang et al. 2023, App. C) — one backward
    pass instead of G components. The audit then checks that one group + bias rebuild every value.
    """
    binding = forward.binding
    rules = effective_rules(binding, options_of(alpha, threshold, variant))
    if linearized and not linear_in_groups(rules):
        raise InputError("the linearized pass needs signed α or D̄ (--alpha signed or --variant bar); "
                         "abs and hybrid α are not linear in the groups")
    rows = Rows.of(binding, forward.values, forward.mapping)
    partitions, onehot = _partition(rows, forward.values, groups, word_ids, tokens)
    if linearized:
        onehot = torch.ones_like(onehot[:1])
    with torch.set_grad_enabled(linearized):
        return _walk(forward, rules, partitions, rows, onehot, audit, keep, linearized)


def run_pass(model: Any, rules, inputs: dict[str, Any], *, device: str = "cpu", dtype: torch.dtype = torch.float32,
             keep: bool = False, linearized: bool = False, audit: bool = True, **arguments: Any) -> Components:
    """Every component, for inspection and tests: the prologue and :func:`components` (``arguments``:
    ``groups``, ``word_ids``, ``tokens``, ``alpha``, ``threshold``, ``variant``) without the scores."""
    graph, ruleset = prepared(model, rules)
    if ruleset.pass_name != "decomposition":
        raise InputError(f"rule set {ruleset.name or ruleset.source!r} is a {ruleset.pass_name} rule set; "
                         "the decomposition pass needs `pass: decomposition`")
    start = forward(graph, ruleset, inputs, None, output=None, position=None, device=device, dtype=dtype,
                    chosen=DecompositionPass)
    return components(start, audit=audit, keep=keep, linearized=linearized, **arguments)


def options_of(alpha: str | None = None, threshold: float | None = None, variant: str | None = None) -> dict:
    return {k: v for k, v in dict(alpha=alpha, threshold=threshold, variant=variant).items() if v is not None}


def effective_rules(binding: Binding, options: dict) -> dict:
    """The rule of each assignment with ``options`` (--alpha, --lambda, --variant) applied, by rule id."""
    rules = {}
    for a in binding.assignments.values():
        if id(a.rule) not in rules:
            try:
                rules[id(a.rule)] = a.rule.with_options(options)
            except ValueError as exc:
                raise InputError(str(exc)) from None
    return rules


def linear_in_groups(rules: dict) -> bool:
    """Whether every activation is signed D̂ or D̄ (then the pass is linear in the group components)."""
    return all(r.variant == "bar" or r.alpha == "signed" for r in rules.values() if r.name == "activation")


def _walk(forward: Forward, rules, partitions, rows: "Rows", onehot, audit, keep, linearized) -> Components:
    binding = forward.binding
    reads = [[v for v, c in zip(node.inputs, binding.carried.get(node.name, ())) if c] for node in binding.reached]
    wanted = set(binding.graph.outputs).union(*reads)
    parts, leaves = _boundary_parts(binding, forward.values, rows, onehot, wanted, linearized)
    walker = DecompositionWalk(forward, rules, parts, wanted, audit, linearized)
    walker.run(binding.reached, None if keep else      # components no later node reads: dropped after it
               [StepLife(dead, (), ()) for dead in deaths(reads, set(binding.graph.outputs))])
    settings = next(({"variant": r.variant, "alpha": r.alpha, "lambda": r.threshold} for r in rules.values()
                     if r.name == "activation"), {})
    return Components(forward, partitions, rows, parts, walker.errors, walker.stranded, settings, leaves)


def _boundary_parts(binding: Binding, env: Values, rows: "Rows", onehot: Tensor, wanted: set[str],
                    linearized: bool) -> tuple[dict[str, Parts], dict[str, Tensor]]:
    """The components of the boundary values (Eq. 14), and in the linearized pass their autograd leaves."""
    parts: dict[str, Parts] = {}
    leaves: dict[str, Tensor] = {}
    for v in binding.boundary:
        if v in wanted:
            x = env[v]
            if linearized:
                leaves[v] = x.detach().clone().requires_grad_(True)
                if rows.mapping.values[v].origins is None:
                    parts[v] = Parts(leaves[v].unsqueeze(0), torch.zeros_like(x))
                else:              # elements of no input position go to the bias component
                    covered = rows.mask(v, torch.ones_like(onehot[:1]), x)
                    parts[v] = Parts(covered * leaves[v], x.detach() * (1 - covered[0]))
                continue
            mask = rows.mask(v, onehot, x)
            groups = mask * x
            parts[v] = Parts(groups, x - groups.sum(0) if rows.mapping.values[v].origins is not None else
                             torch.zeros_like(x))
    return parts, leaves


class DecompositionWalk(Walker):
    """The decomposition pass as a :class:`~rulegraph.lifetimes.Walker` over the reached nodes in topological
    order, over the components (``parts``: value → :class:`Parts`): each visit maps a node's input
    components to its outputs' by its rule; an input's components that die there are written into by the
    rule where nothing else holds them, then dropped."""

    def __init__(self, forward: Forward, rules: dict, parts: dict[str, Parts], wanted: set[str], audit: bool,
                 linearized: bool):
        super().__init__(parts)         # no recycler: components are dropped, not kept for reuse
        self.binding, self.plan, self.values = forward.binding, forward.plan, forward.values
        self.rules, self.wanted, self.audit, self.linearized = rules, wanted, audit, linearized
        self.errors: dict[str, tuple[Tensor, Tensor]] = {}
        self.sums = GroupSums()          # Σ_g D_g per group tensor, for the audit and the activations
        self.stranded: list[str] = []

    def visit(self, node: Node, life: StepLife | None) -> None:
        parts, env = self.env, self.values
        assignment = self.binding.assignments.get(node.name)
        if assignment is None:
            self.stranded.append(node.name)
            return
        step = self.plan.step_by_name[node.name]
        carried = self.binding.carried[node.name]
        in_parts = [parts.get(v) if c else None for v, c in zip(node.inputs, carried)]
        if any(c and p is None for c, p in zip(carried, in_parts)):
            self.stranded.append(node.name)       # an input whose producer had no rule: taken as a constant
        if not any(p is not None for p in in_parts):
            return
        outputs = [env.get(v) for v in node.outputs]
        numel = max(1, outputs[0].numel() if isinstance(outputs[0], Tensor) else 1)
        # inputs whose components die here, written into by the rule where nothing else holds them
        dying = life.dead if life is not None else ()
        owned = [p is not None and not self.linearized and v in dying and _sole_holder(p)
                 for v, p in zip(node.inputs, in_parts)]
        site = ComponentSite(node, step.spec, step.attrs, env.arguments(step), outputs, in_parts,
                             chunk=max(1, CHUNK_ELEMENTS // numel), linearized=self.linearized, sums=self.sums,
                             owned=owned)
        result = rule_failed(self.rules[id(assignment.rule)].decompose, site, node, assignment.where)
        del site        # it holds the inputs' components, which the next node's _sole_holder counts
        for v, value, p in zip(node.outputs, outputs, result, strict=True):
            if p is None or v not in self.wanted:
                continue
            parts[v] = p
            if self.audit:
                with torch.no_grad():
                    gap = (p.total(self.sums) - value).abs().max()
                    self.errors[node.name] = (gap, value.abs().max())


def _sole_holder(parts: Parts) -> bool:
    """Whether ``parts`` alone holds its groups tensor: no other value's components (a rule that hands the
    groups on unchanged shares them) and no view of its memory."""
    return sole_owner(parts.groups, 1)        # the attribute


@dataclass
class Rows:
    """The positions a partition groups: the positions (dim 1) of the inputs the boundary values map
    to (:mod:`rulegraph.boundary`: a lookup's elements to its input's positions; a float input or a
    node boundary is its own), laid end to end by sequence axis. Inputs that share a named sequence
    axis (``input_ids``, ``token_type_ids``) share their rows; an input with an axis of its own (an
    encoder–decoder's ``decoder_input_ids``) adds rows after them, in graph-input order. Each axis is
    reported under its first key (:attr:`keys`)."""

    batch: int
    keys: dict[str, tuple[int, int]]          # reporting key → (first row, rows)
    spans: dict[str, tuple[int, int]]         # boundary value → (first row, rows)
    mapping: BoundaryMap = field(default_factory=BoundaryMap)

    def mask(self, value: str, onehot: Tensor, x: Tensor) -> Tensor:
        """``[G, *x.shape]`` (trailing dims of size 1): which group each element of boundary value
        ``x`` belongs to, from the one-hot ``[G, batch, rows]``; elements of no input position
        (a constant the model inserts) belong to none, so they go to the bias component."""
        start, length = self.spans[value]
        mapped = self.mapping.values[value]
        where = mapped.positions()
        if mapped.origins is None:
            mask = onehot[:, :, start:start + length]
            return mask.reshape(mask.shape + (1,) * (x.dim() - 2)).to(x.dtype)
        if where is None:
            raise InputError(f"the boundary value {value!r} maps to an input without a positions dimension")
        batch, pos = where
        valid = (batch >= 0).to(x.dtype)
        mask = onehot[:, batch.clamp(min=0), start + pos.clamp(min=0)].to(x.dtype) * valid
        return mask.reshape(mask.shape + (1,) * mapped.features)

    @property
    def length(self) -> int:
        return sum(n for _, n in self.keys.values())

    def span(self, value: str) -> tuple[int, int]:
        return self.spans[value]

    @classmethod
    def of(cls, binding: Binding, env: dict, mapping: BoundaryMap | None = None) -> "Rows":
        graph = binding.graph
        mapping = mapping or BoundaryMap({v: Mapped(k) for v, k in binding.boundary.items()})
        order = {name: i for i, name in enumerate(graph.input_names)}
        axis_of = {i.name: i.shape[1] for i in graph.inputs
                   if i.shape is not None and len(i.shape) > 1 and isinstance(i.shape[1], str)}

        def rows(v: str) -> tuple[int, ...]:          # [batch, positions] of what v maps to
            m = mapping.values[v]
            return tuple(m.shape[:2]) if m.origins is not None else tuple(env[v].shape[:2])

        axes: dict[str, list[str]] = {}               # sequence axis → boundary values on it
        for v, key in sorted(binding.boundary.items(), key=lambda kv: order.get(kv[1], len(order))):
            if v in env and len(rows(v)) == 2:
                axes.setdefault(axis_of.get(key, ""), []).append(v)
        if not axes:
            raise InputError("the decomposition boundary has no value with a positions dimension (dim 1)")
        keys, spans, batches, start = {}, {}, set(), 0
        for values in axes.values():
            shapes = {rows(v) for v in values}
            if len(shapes) > 1:
                raise InputError(f"boundary values disagree on [batch, positions]: {sorted(shapes)}")
            batch, length = shapes.pop()
            batches.add(batch)
            keys[binding.boundary[values[0]]] = (start, length)
            spans.update({v: (start, length) for v in values})
            start += length
        if len(batches) > 1:
            raise InputError(f"boundary values disagree on the batch size: {sorted(batches)}")
        return cls(batches.pop(), keys, spans, mapping)


def _partition(rows: Rows, env: dict, groups, word_ids, tokens) -> tuple[list[Partition], Tensor]:
    """One partition per batch item, and the one-hot ``[G, batch, rows]`` assignment."""
    batch, length = rows.batch, rows.length
    if word_ids is not None and len(word_ids) != batch:
        raise InputError(f"got word ids for {len(word_ids)} items, but the batch has {batch}")
    partitions = [assign(groups, length, word_ids[b] if word_ids is not None else None,
                         tokens[b] if tokens is not None else None) for b in range(batch)]
    size = max(p.size for p in partitions)
    device = next(iter(env.values())).device
    index = torch.tensor([p.index for p in partitions], device=device)
    onehot = torch.nn.functional.one_hot(index, size).permute(2, 0, 1)
    return partitions, onehot


@PASSES.register("decomposition")
class DecompositionPass(Pass):
    """Linear decomposition (Yang et al. 2023) of the output into group contributions.

    Arguments (``explain(..., groups=…)``): ``groups``: ``token`` (default), ``word`` (needs
    ``word_ids``, one list per batch item, as :class:`~rulegraph.text.Encoded` has them),
    ``source:K``, ``"0-3,4-9"`` or a list of position lists; ``tokens`` label the groups.
    ``alpha`` / ``threshold`` (λ) / ``variant`` override the rule file's ``activation``
    params. ``mode``: ``components`` carries every group's component through the graph;
    ``linearized`` one group and a backward pass (signed α or D̄ only; see
    :func:`components`); ``auto`` (default) takes ``linearized`` where it applies.

    The explanation's ``relevance[key]`` (and ``boundary[key]``) holds per-position scores
    (a group's contribution spread evenly over its positions), ``extra["decomposition"]``
    the group contributions and the bias component's share, ``audit`` a
    :class:`DecompositionAudit`.
    """

    unmatched: ClassVar[str] = "their outputs are taken as constants"

    def run(self, forward: Forward, *, audit: bool, groups: Any, word_ids, tokens, alpha: str | None,
            threshold: float | None, variant: str | None, mode: str) -> Explanation:
        if mode == "auto":
            rules = effective_rules(forward.binding, options_of(alpha, threshold, variant))
            mode = "linearized" if linear_in_groups(rules) else "components"
        result = components(forward, groups=groups, word_ids=word_ids, tokens=tokens, alpha=alpha,
                            threshold=threshold, variant=variant, audit=audit, linearized=mode == "linearized")
        output, seed = forward.output, forward.seed
        out = forward.out
        p = result.parts.get(output)
        if p is None:
            node = forward.graph.producer.get(output)
            what = f"its producer {node.name!r} ({node.op}) got no components" if node is not None else "none reach it"
            raise RuleMatchError(f"{forward.ruleset.source}: the decomposition carries no components to the output "
                                 f"{output!r}: {what}; every rule on the way held its inputs as coefficients")
        if result.leaves:
            scores = _scores_by_gradient(result, p, seed)
        else:
            scores = (p.groups * seed).flatten(2).sum(2).T.double()          # [batch, G]
        bias = (p.bias * seed).flatten(1).sum(1).double()                  # [batch]
        explained = forward.explained
        if not torch.isfinite(scores).all():
            raise NumericalError("a group contribution is NaN or inf; try --alpha hybrid or abs")
        per_position = torch.zeros(len(result.partitions), len(result.partitions[0].index), dtype=torch.float64)
        items = []
        for b, part in enumerate(result.partitions):
            members = part.members()
            for g, positions in enumerate(members):
                per_position[b, positions] = float(scores[b, g]) / len(positions)
            items.append({"groups": [{"label": part.labels[g], "positions": members[g], "score": float(scores[b, g])}
                                     for g in range(part.size)], "bias": float(bias[b])})
        info = {"partition": groups if isinstance(groups, str) else "explicit", "mode": mode, **result.settings,
                **(items[0] if len(items) == 1 else {"items": items})}
        scores_by_key = {key: per_position[:, start:start + length].to(out.dtype)
                         for key, (start, length) in result.rows.keys.items()}
        e = forward.explanation(relevance=scores_by_key, boundary=dict(scores_by_key),
                                audit=_audit(result, forward.plan.dtype, explained, scores, bias) if audit else None)
        e.extra["decomposition"] = info
        return e


def _scores_by_gradient(result: Components, p: Parts, seed: Tensor) -> Tensor:
    """Group contributions ``Σ_{i∈g} x_i · ∂D(y)/∂x_i`` of the linearized pass, ``[batch, G]``."""
    leaves = list(result.leaves.items())
    grads = torch.autograd.grad((p.groups[0] * seed).sum(), [x for _, x in leaves], allow_unused=True)
    rows = result.rows
    per_position = torch.zeros(rows.batch, rows.length, dtype=seed.dtype, device=seed.device)
    for (v, x), g in zip(leaves, grads):
        if g is not None:
            start, length = rows.span(v)
            r = rows.mapping.to_input(v, (x * g).detach())
            per_position[:, start:start + length] += r.reshape(r.shape[0], r.shape[1], -1).sum(2)
    index = torch.tensor([q.index for q in result.partitions], device=per_position.device)
    size = max(q.size for q in result.partitions)
    onehot = torch.nn.functional.one_hot(index, size).to(per_position.dtype)      # [batch, T, G]
    return torch.einsum("bt,btg->bg", per_position, onehot).double()


def _audit(result: Components, dtype: torch.dtype, explained: Tensor, scores: Tensor, bias: Tensor) -> DecompositionAudit:
    graph, binding = result.binding.graph, result.binding
    layer_of = graph.layers
    names = [n for n in (node.name for node in binding.reached) if n in result.errors]
    figures = torch.stack([torch.stack(result.errors[n]) for n in names]).double().cpu() if names else torch.zeros(0, 2)
    nodes, layers = [], {}
    for name, (gap, scale) in zip(names, figures.tolist()):
        node = graph.node(name)
        a = binding.assignments[name]
        rel = relative(gap, scale)
        nodes.append(NodeAudit(name=name, op=node.op, layer=layer_of[name], rule=a.rule.describe(), where=a.where,
                               conserving=True, relevance_in=0.0, relevance_out=0.0, absorbed=0.0, breaks=0.0,
                               error=gap, relative_error=rel))
        layer = layers.setdefault(layer_of[name], LayerReconstruction(layer_of[name]))
        layer.nodes += 1
        if rel >= layer.max_relative_error:
            layer.max_relative_error, layer.worst_node = rel, name
        layer.max_abs_error = max(layer.max_abs_error, gap)
    output_value = float(explained.sum())
    input_total = float(scores.sum())
    absorbed = float(bias.sum())
    residual = output_value - input_total - absorbed
    conservation = Conservation(output_value=output_value, input_total=input_total, absorbed=absorbed, breaks=0.0,
                                residual=residual, relative_error=relative(residual, output_value),
                                stranded={n: 0.0 for n in result.stranded})
    summary = [LayerAudit(name=r.name, relevance_in=0.0, relevance_out=0.0, absorbed=0.0, breaks=0.0, nodes=r.nodes)
               for r in layers.values()]
    return DecompositionAudit(conservation, summary, nodes, tolerance(dtype),
                              reconstruction=list(layers.values()))
