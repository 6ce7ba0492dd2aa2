"""What every pass shares: the prologue before the walk, and the base class of a pass.

:func:`forward` is the one prologue: bind the rule set to the graph (boundary, taint, a rule
per reached node), refuse a node without a rule when the rule set says ``on_unmatched:
error``, prepare the plan, run the forward keeping what the walk reads, check the output,
and pick the explained scalar per batch item (the *seed*). A :class:`Pass` then walks the
reached nodes with its own rules and turns what it found into an
:class:`~rulegraph.explanation.Explanation`.

The explained scalar is, per batch item, one entry of the chosen output: by default the
argmax over the last axis (the predicted class), at the last position for sequence outputs
(``[batch, positions, classes]``).

The target is explicit (:func:`admit`, the one order of refusals ``explain`` and ``check`` share):
the output is any value of the graph (default its first output); one that a final ``Softmax`` or
``LogSoftmax`` produces is explained as that node's input, the logits, unless
``score="probability"`` (:mod:`rulegraph.final_softmax`); an output whose leading dim is not the
inputs' batch has no batch axis: it is one item's ``[positions, classes]`` (or ``[classes]``), given a
leading batch axis of 1 on the graph (:func:`rulegraph.final_softmax.with_batch_axis`) so every pass sees one.

Beyond one logit (:func:`select`, ``contrast=`` and ``score=``):

* ``contrast=B``: the seed is +1 at the target A and −1 at B, so the explained scalar is
  ``z_A − z_B``, and relevance conserves to that difference.
* ``score="logprob"``: log softmax(z)_A is not linear in the logits; its gradient with
  respect to z is ``e_A − p`` (p = softmax(z)). The seed is that vector with p held
  constant, so the explained scalar is the linear function ``z_A − Σ_j p_j z_j`` (p held
  constant) and relevance conserves to it. Its value is ``log p_A + (logsumexp(z) − Σ_j p_j z_j)``,
  i.e. log p_A plus the entropy H(p) (shift-invariant like log p_A); the explanation reports
  both (``output_value`` and ``extra["logprob"]``). Under ``gi`` the scores are
  ``x ⊙ ∂(z_A − Σ p_j z_j)/∂x`` with p detached, which is also ``x ⊙ ∂ log p_A/∂x``.
* ``contrast="runner-up"``: B is, per item, the class with the highest logit other than A (the
  prediction's closest rival), so the explained scalar is ``z_A − z_B = log p_A − log p_B``.
* both: ``log p_A − log p_B = z_A − z_B``, so the seed is the logit contrast's (``e_A − e_B``)
  and the explained scalar is exactly the log-probability ratio.
* ``objective="logprob[' Paris'] - logprob[' London']"``: any linear expression of logits and
  log-probabilities of the explained position (:mod:`rulegraph.objective`); the seed is its
  weights w with p held constant, the explained scalar Σ w_j z_j, and ``extra["objective_value"]``
  the expression itself.
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import torch

from ..boundary import BoundaryMap, absorbing, origins
from ..canonize import canonize
from ..errors import InputError, ModelError, NumericalError, RulegraphError
from ..explanation import Explanation, at_position, row_of
from ..objective import QUANTITIES, Objective
from ..options import LOGITS, PASS_OPTIONS, READS_INSIDE, Option, resolve
from ..interpreter import Plan, Values, all_finite, prepare
from ..ir import Graph
from ..canonize.final_softmax import final_node, only, with_batch_axis
from ..canonize.rows import head_rows, pooled
from ..facts import roles
from ..loaders.metadata import CAUSAL_TASKS, export_info
from ..ops import lookup, unsupported
from ..lifetimes import Recycler
from ..loaders import load
from ..loaders.metadata import labels  # noqa: F401  (re-exported: its home is loaders.metadata)
from ..registry import Registry
from ..rounding import measure
from ..tolerances import tolerance
from .replay import NOT_REPLAYED, Replay, refuse, run_forward
from ..ruleset import Binding, RuleSet

Tensor = torch.Tensor

EXPLAINED, ALL = LOGITS


@dataclass
class Forward:
    """The prologue's result: what every pass starts its walk from."""

    graph: Graph
    ruleset: RuleSet
    binding: Binding
    plan: Plan
    values: Values                # every value the walk reads, and the run's static arguments
    output: str                   # the explained graph output
    seed: Tensor                  # one-hot selection of the explained scalar, the output's shape
    targets: list[int]            # explained index along the last axis, per batch item
    position: int | list[int] | None   # explained position for sequence outputs (or one per batch item)
    contrast: list[int] | None = None   # subtracted index per batch item (``contrast=``)
    score: str = "logit"                # "logit" or "logprob" (see the module docstring)
    objective: Objective | None = None  # a linear expression explained instead (``objective=``)
    mapping: BoundaryMap | None = None  # how each boundary value maps to its input's positions (boundary.py)
    final: dict | None = None           # the final Softmax / LogSoftmax explained as its logits (Admitted.final)
    recycler: Recycler | None = None    # the explanation's, where the forward and the walk keep large tensors
    inputs: Mapping[str, Any] | None = None   # the inputs the forward ran on (the rounding check runs them again)
    shared: bool = False                # more walks follow on these values: the walk leaves them whole
    rows: tuple[int, ...] | None = None  # the positions the output's rows hold (a language model's head computed
                                         # only where explained: :mod:`rulegraph.canonize.rows`); None: every one
    replay: Replay | None = None        # the input shape's traced forward and walks (passes.replay), where replayed

    @property
    def out(self) -> Tensor:
        return self.values[self.output]

    def value(self, name: str) -> Tensor:
        """A forward value, computed again where the forward freed it (:meth:`Plan.recompute`)."""
        if name not in self.values:
            self.plan.recompute(self.values, name, self.recycler)
        return self.values[name]

    def retarget(self, targets: list[int], *, shared: bool, position: int | None = None) -> Forward:
        """This forward seeded for other targets (one per batch item) at the same position (or at
        ``position``: a continuation's step), its values shared, not copied: ``shared`` when another walk
        follows on them (:func:`apply_targets`)."""
        score = "logit" if self.score == PROBABILITY else self.score
        position = self.position if position is None else position
        seed, targets, _ = select(self.out, targets, position, None, score, rows=self.rows)
        return replace(self, seed=seed, targets=targets, shared=shared, position=position)

    @property
    def explained(self) -> Tensor:
        """The explained scalar per batch item, in float64."""
        out = self.out
        if out.dim() <= 1:
            return (out * self.seed).double()
        # a dot product per batch item: a [positions, vocabulary] product is never held
        return torch.bmm(out.flatten(1).unsqueeze(1), self.seed.flatten(1).unsqueeze(2)).reshape(-1).double()

    def explanation(self, relevance: dict[str, Tensor], boundary: dict[str, Tensor], audit=None) -> Explanation:
        """An :class:`Explanation` of this forward with the pass's scores."""
        e = Explanation(
            output=self.output, output_tensor=self.out.detach().cpu(), target=self.targets, position=self.position,
            output_value=self.explained.tolist(), relevance=relevance, boundary=boundary,
            method=self.ruleset.name or self.ruleset.source, audit=audit, labels=labels(self.graph),
            rows=None if self.rows is None else list(self.rows))
        describe(e, self.out, self.contrast, self.score, self.objective, self.rows)
        if self.final is not None:
            e.extra["final"] = dict(self.final)
        rounding = measure(self.graph, self.inputs, self.output, self.out) if audit is not None and self.inputs else None
        if rounding is not None:            # a graph rounding activations to integers: its own spread beside ours
            e.extra["rounding"] = rounding.to_dict()
        return e


def describe(e: Explanation, out: Tensor, contrast: list[int] | None, score: str,
             objective: Objective | None = None, rows: Sequence[int] | None = None) -> None:
    """Record a contrast, a log-probability score or an objective on ``e`` (nothing for a plain
    logit, so class-logit explanations are as before): ``e.contrast``, ``e.score`` and, for
    ``score="logprob"``, ``e.extra["logprob"]`` (log p_A, or log p_A − log p_B with a contrast);
    ``e.extra["objective"]`` and ``["objective_value"]`` for an objective."""
    if objective is not None:
        e.extra["objective"] = objective.text
        whole = objective.region is not None or objective.positions is not None
        e.extra["objective_value"] = objective.at_rows(rows).value(out if whole else at_position(out, e.position, rows))
        return
    if contrast is None and score == "logit":
        return
    e.contrast, e.score = contrast, score
    if score == "logprob":
        picked = at_position(out, e.position, rows).double().log_softmax(-1)
        items = torch.arange(picked.shape[0])
        value = picked[items, e.target]
        if contrast is not None:
            value = value - picked[items, contrast]
        e.extra["logprob"] = value.tolist()


class Pass:
    """Base class of a pass; registered in :data:`rulegraph.passes.PASSES` under the name a rule
    file's ``pass:`` gives. A pass's extra arguments (``explain(..., groups=…)``) are its
    options, declared in :data:`rulegraph.options.PASS_OPTIONS` under its name (the command line
    and the methods read the same declaration); :meth:`run` walks the reached nodes and returns
    the explanation."""

    name: ClassVar[str] = ""
    #: what becomes of relevance (or components) at a node without a rule under ``on_unmatched: warn``
    unmatched: ClassVar[str] = "relevance reaching them is dropped"

    def run(self, forward: Forward, *, audit: bool, **options: Any) -> Explanation:
        raise NotImplementedError

    def run_many(self, forwards: Iterable[Forward], *, audit: bool, **options: Any) -> list[Explanation]:
        """:meth:`run` for several seeds of one forward's values (:meth:`Forward.retarget`, seeded as they are
        read), in their order; by default one walk each (a pass that batches them overrides this)."""
        return [self.run(f, audit=audit, **options) for f in forwards]

    @classmethod
    def keeps(cls, binding: Binding, plan: Plan) -> frozenset[str]:
        """The values the forward keeps for the walk (default: every value a reached node touches)."""
        return binding.needed_values

    @classmethod
    def spills(cls, binding: Binding, plan: Plan) -> frozenset[str]:
        """Of :meth:`keeps`, the values the forward frees where they are large, because the pass computes
        them again (default: none; see :meth:`~rulegraph.interpreter.Plan.run`'s ``spill``)."""
        return frozenset()

    @classmethod
    def options(cls) -> tuple[Option, ...]:
        return PASS_OPTIONS.get(cls.name, ())

    @classmethod
    def resolve(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` checked against the declared ones, defaults filled in."""
        return resolve(cls.options(), options, cls.name, noun="pass")


#: pass name → :class:`Pass` subclass; a rule file's ``pass:`` names one (rulegraph.propagation.RULES has its rules)
PASSES: Registry[type[Pass]] = Registry("pass", InputError)


def pass_of(ruleset: RuleSet) -> type[Pass]:
    """The pass that runs ``ruleset`` (its ``pass:``; the one place this is decided)."""
    return PASSES.get(ruleset.pass_name)


def prepared(model: Any, rules: RuleSet | str) -> tuple[Graph, RuleSet]:
    """The graph as the rule set sees it (loaded, canonized) and the rule set (read)."""
    ruleset = rules if isinstance(rules, RuleSet) else RuleSet.load(rules)
    return canonize(load(model), ruleset.canonize), ruleset


def decided(model: Any, rules: RuleSet | str) -> str:
    """What the rule set decides on ``model`` (:meth:`~rulegraph.ruleset.Binding.fingerprint`, on the graph its
    canonizers make): equal for two rule files whose texts differ only where the model is not concerned."""
    graph, ruleset = prepared(model, rules)
    return ruleset.bind(graph).fingerprint()


def apply(model: Any, rules: RuleSet | str, inputs: dict[str, Any], target: int | Sequence[int] | None = None, *,
          output: str | None = None, position: int | Sequence[int] | None = None, device: str = "cpu",
          dtype: torch.dtype = torch.float32, audit: bool = True, contrast: int | Sequence[int] | None = None,
          score: str = "logit", objective: Objective | None = None, logits: str = EXPLAINED, replay: bool = False,
          compiled: bool = False, **options: Any) -> Explanation:
    """``rules`` applied to ``model``'s output for ``inputs``: the prologue (:func:`forward`), then
    the pass the rule set names with its ``options`` (see :func:`rulegraph.explain`, which takes
    text, token and class names, and any method, and calls this for rule sets). ``compiled``: replayed, the
    traces compiled (:mod:`rulegraph.passes.replay`)."""
    graph, ruleset = prepared(model, rules)
    chosen = pass_of(ruleset)
    options = chosen.resolve(options)
    replay = replay or compiled
    if replay:
        refuse({name: options.get(name) for name in NOT_REPLAYED})
    start = forward(graph, ruleset, inputs, target, output=output, position=position, device=device, dtype=dtype,
                    contrast=contrast, score=score, objective=objective, chosen=chosen,
                    recycler=None if replay else Recycler(), logits=logits, replay=replay, compiled=compiled,
                    pool=poolable(chosen, options))
    return chosen().run(start, audit=audit, **options)


def poolable(chosen: type[Pass], options: dict[str, Any]) -> bool:
    """Whether the pass may run on a graph whose last layers hold the pooled position only: the relevance
    pass, with no value recorded or conditioned (those read every position)."""
    return chosen.name == "relevance" and not any(options.get(name) for name in READS_INSIDE)


def apply_targets(model: Any, rules: RuleSet | str, inputs: dict[str, Any], targets: str | Sequence[int] | None, *,
                  target: int | Sequence[int] | None = None, output: str | None = None,
                  position: int | Sequence[int] | None = None, positions: Sequence[int] | None = None,
                  device: str = "cpu", dtype: torch.dtype = torch.float32, audit: bool = True, score: str = "logit",
                  contrast: None = None, logits: str = EXPLAINED, replay: bool = False, compiled: bool = False,
                  **options: Any) -> list[Explanation]:
    """``rules`` applied for many targets from **one forward**, each with its own audit: the pass's
    :meth:`Pass.run_many` on the forward seeded for each (:meth:`Forward.retarget`; the relevance pass walks
    them all at once). ``targets``: ``"all"``, ``"top-K"`` or a list of class / vocabulary indices
    (:func:`target_sets`); ``None``: ``target`` alone (default the argmax), for conditions that make several
    maps. ``positions``: with a list of targets, each one's position (a continuation's steps, each token at
    the position that predicts it). The explanations equal :func:`apply`'s, one target at a time (float64
    to 1e-12 relative)."""
    if contrast is not None:
        raise InputError("targets=… explains each of several classes; give it without a contrast")
    if replay or compiled:
        refuse({"targets=…": True})
    graph, ruleset = prepared(model, rules)
    chosen = pass_of(ruleset)
    options = chosen.resolve(options)
    start = forward(graph, ruleset, inputs, target, output=output, position=position, device=device, dtype=dtype,
                    score=score, chosen=chosen, recycler=None if replay else Recycler(), logits=logits,
                    rows=positions or (), replay=replay, pool=poolable(chosen, options))
    if targets is None:
        return chosen().run_many([start], audit=audit, **options)
    if positions is not None:
        if isinstance(targets, str) or len(positions) != len(targets) or len(targets) > MAX_TARGETS:
            raise InputError(f"positions gives each of at most {MAX_TARGETS} targets its position: "
                             f"{len(positions)} for {targets!r}")
        sets = [target_sets(start.out, [t], p, start.rows)[0] for t, p in zip(targets, positions)]
    else:
        sets = target_sets(start.out, targets, start.position, start.rows)
        positions = [None] * len(sets)
    return chosen().run_many((start.retarget(t, shared=k + 1 < len(sets), position=p)     # seeded as walked
                              for k, (t, p) in enumerate(zip(sets, positions))), audit=audit, **options)


#: the most targets one call explains (``targets="all"`` on a language model's vocabulary is refused)
MAX_TARGETS = 256


def target_sets(out: Tensor, targets: str | Sequence[int], position: int | list[int] | None,
                rows: Sequence[int] | None = None) -> list[list[int]]:
    """The targets of each walk, one per batch item: ``"all"`` every class in order, ``"top-K"`` each
    item's K highest outputs (highest first), a list those classes in its order; at most
    :data:`MAX_TARGETS`. ``rows``: the positions ``out``'s rows hold (:attr:`Forward.rows`)."""
    picked = at_position(out, position, rows)
    batch, classes = picked.shape
    if isinstance(targets, str):
        spec = targets.strip().lower()
        if spec == "all":
            if classes > MAX_TARGETS:
                raise InputError(f"targets='all' would explain {classes} classes; the limit is {MAX_TARGETS}: give "
                                 f"'top-K' or a list")
            return [[c] * batch for c in range(classes)]
        head, _, count = spec.partition("-")
        if head != "top" or not count.isdigit() or not 1 <= int(count) <= min(classes, MAX_TARGETS):
            raise InputError(f"targets must be 'all', 'top-K' with K in 1…{min(classes, MAX_TARGETS)}, or a list of "
                             f"class indices; got {targets!r}")
        top = picked.detach().topk(int(count), dim=-1).indices.tolist()
        return [[row[k] for row in top] for k in range(int(count))]
    if not isinstance(targets, Sequence) or not targets or not all(_is_index(t) for t in targets):
        raise InputError(f"targets must be 'all', 'top-K' or a non-empty list of class indices; got {targets!r}")
    if len(targets) > MAX_TARGETS:
        raise InputError(f"{len(targets)} targets; the limit is {MAX_TARGETS}")
    bad = [int(t) for t in targets if not 0 <= int(t) < classes]
    if bad:
        raise InputError(f"target {bad[0]} is out of range; the output has {classes} classes (0…{classes - 1})")
    return [[int(t)] * batch for t in targets]


def forward(graph: Graph, ruleset: RuleSet, inputs: dict[str, Any], target: int | Sequence[int] | None, *,
            output: str | None, position: int | None, device: str, dtype: torch.dtype,
            contrast: int | Sequence[int] | None = None, score: str = "logit", objective: Objective | None = None,
            chosen: type[Pass] = Pass, recycler: Recycler | None = None, logits: str = EXPLAINED,
            rows: Sequence[int] = (), replay: bool = False, compiled: bool = False, pool: bool = False) -> Forward:
    """The shared prologue (see the module docstring) for the pass ``chosen``: its :meth:`Pass.keeps` and
    :meth:`Pass.spills` say what the forward keeps, its ``unmatched`` what the warning about nodes without
    a rule says. ``logits``: a causal language model's head computed only at the positions explained
    (``"explained"``: the explained one, the span's, and ``rows``, which later walks read) or at every
    position (``"all"``). ``replay``: the forward replayed for the inputs' shape (:mod:`rulegraph.passes.replay`,
    traced the first time), and the walk after it; ``compiled``: the traces compiled, on a CPU.
    ``pool`` (and ``logits`` ``"explained"``): a classifier's last layers computed at the position its head reads
    (:func:`pooled_rows`), where that gives the same output and every node keeps its rule."""
    check_arguments(inputs, target, position, contrast, score, objective)
    replay = replay or compiled                 # (compiled traces are replayed)
    if replay and chosen.name != "relevance":
        raise InputError(f"replay: the {chosen.name} pass is not replayed (only the relevance pass is); drop replay")
    if compiled and torch.device(device).type != "cpu":
        raise InputError(f"compiled: replays on {device} are captured as CUDA graphs, not compiled; drop compiled "
                         "and give replay")
    if logits not in LOGITS:
        raise InputError(f"logits must be one of {', '.join(map(repr, LOGITS))}; got {logits!r}")
    admitted = admit(graph, ruleset, output, score)
    graph, binding, output = admitted.graph, admitted.binding, admitted.output
    held = explained_rows(graph, output, inputs, position, objective, rows) if logits == EXPLAINED else None
    if held is not None:
        graph, binding, held = narrowed(graph, binding, ruleset, output, *held)
    whole = (graph, binding) if pool and logits == EXPLAINED and held is None else None
    if whole is not None:
        graph, binding = pooled_rows(graph, binding, ruleset)
    if binding.unmatched and ruleset.on_unmatched == "warn":
        first = binding.unmatched[0]
        warnings.warn(f"{len(binding.unmatched)} node(s) have no rule; {chosen.unmatched} "
                      f"(first: {first.name!r}, op {first.op})", stacklevel=3)

    def run(graph: Graph, binding: Binding) -> tuple[Plan, Values, Replay | None]:
        plan = prepare(graph, device, dtype)
        keep, spill = chosen.keeps(binding, plan), chosen.spills(binding, plan)
        if replay:
            return plan, *run_forward(binding, plan, inputs, keep, spill, compiled=compiled)
        return plan, plan.run(inputs, keep=keep, spill=spill, recycler=recycler), None

    if whole is not None and graph is not whole[0]:
        graph, binding, (plan, values, replayed) = _pooled_run(whole, (graph, binding), run, output, inputs)
    else:
        plan, values, replayed = run(graph, binding)
    if not has_batch_axis(values[output], inputs, output):     # one item's value: given a batch axis of 1, run again
        graph = with_batch_axis(graph, output)
        binding = ruleset.bind(graph)
        binding.require_complete()
        plan = prepare(graph, device, dtype)
        values = plan.run(inputs, keep=chosen.keeps(binding, plan), spill=chosen.spills(binding, plan),
                          recycler=recycler)
        replayed = None
    out = values[output]
    if not all_finite(out):                     # no temporaries: a language model's logits are [positions, vocabulary]
        raise NumericalError(f"the model's output {output!r} contains NaN or inf for these inputs")
    names = labels(graph)
    if names and admitted.asked == admitted.first and out.shape[-1] != len(names):
        raise ModelError(f"{graph.source or graph.name}: the metadata rulegraph.labels names {len(names)} classes, but "
                         f"the output {output!r} has {out.shape[-1]} per item")
    mapping = boundary_map(binding, plan, values)
    seed, targets, position = select(out, target, position, contrast, "logit" if score == PROBABILITY else score,
                                     objective, rows=held)
    contrasts = None if contrast is None else runner_up(at_position(out, position, held), targets) \
        if contrast == RUNNER_UP else _per_item(contrast, len(targets))
    return Forward(graph, ruleset, binding, plan, values, output, seed, targets, position, contrasts, score, objective,
                   mapping, admitted.final, recycler, inputs, rows=held, replay=replayed)


def explained_rows(graph: Graph, output: str, inputs: Mapping[str, Any], position: Any, objective: Objective | None,
                   also: Sequence[int]) -> tuple[tuple[int, ...], int] | None:
    """The positions of a causal language model's output an explanation reads (the explained one, default
    the last; a span's; ``also``), sorted, and the sequence's length: ``None`` where the export is no causal
    LM, its token ids are not given, or a position is out of range (:func:`select` refuses it as ever)."""
    if export_info(graph).task not in CAUSAL_TASKS or objective is not None and objective.region is not None:
        return None
    ids = inputs.get(roles(graph).ids or "")
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        return None
    length = int(ids.shape[-1])
    if objective is not None and objective.positions is not None:
        wanted = list(objective.positions)
    else:
        wanted = [length - 1] if position is None else [position] if _is_index(position) else list(position)
    wanted = [int(p) for p in (*wanted, *also)]
    if not all(0 <= p < length for p in wanted):
        return None
    return tuple(sorted(set(wanted))), length


def narrowed(graph: Graph, binding: Binding, ruleset: RuleSet, output: str, rows: tuple[int, ...],
             length: int) -> tuple[Graph, Binding, tuple[int, ...] | None]:
    """``graph`` with its head at ``rows`` only (:func:`rulegraph.canonize.rows.head_rows`, the positions
    counted from the end, so the last position's graph serves every length) and its binding; the graph as
    it was where it shows no such head or the rule set has no rule for the Gather it adds."""
    rewritten = head_rows(graph, output, [p - length for p in rows])
    if rewritten is None:
        return graph, binding, None
    try:
        bound = ruleset.bind(rewritten)
        bound.require_complete()
    except RulegraphError:
        return graph, binding, None
    return rewritten, bound, rows


def pooled_rows(graph: Graph, binding: Binding, ruleset: RuleSet) -> tuple[Graph, Binding]:
    """``graph`` with its last layers computed at the position its head reads
    (:func:`rulegraph.canonize.rows.pooled`) and its binding, where the rule set gives every node it keeps the
    rule it had and each picking ``Gather`` it adds the rule of the one it moved; else ``graph`` and
    ``binding`` as they were (and where the output was once found to differ, :func:`pooled_agrees`). Decided
    once per graph and rule set."""
    rewritten = pooled(graph)
    if rewritten is None or graph.cache.canonized.get("pooled-agrees") is False:
        return graph, binding
    decided = rewritten.cache.canonized.setdefault("pooled-bindings", {})
    held = decided.get(id(ruleset))
    if held is None:
        held = decided[id(ruleset)] = (ruleset, _same_rules(binding, rewritten, ruleset))
    return (rewritten, held[1]) if held[1] is not None else (graph, binding)


def _same_rules(binding: Binding, rewritten: Graph, ruleset: RuleSet) -> Binding | None:
    try:
        bound = ruleset.bind(rewritten)
        bound.require_complete()
    except RulegraphError:
        return None

    def rules(b: Binding) -> dict[str, str | None]:
        return {n.name: (a.rule.describe() if (a := b.assignments.get(n.name)) is not None else None)
                for n in b.reached}
    before, after = rules(binding), rules(bound)
    moved = {before[name] for name in before.keys() - after.keys()}        # the pickings it moved
    same = all(rule == before[name] if name in before else rule in moved for name, rule in after.items())
    return bound if same else None


def _pooled_run(whole: tuple[Graph, Binding], pooled: tuple[Graph, Binding], run: Callable, output: str,
                inputs: Mapping[str, Any]) -> tuple[Graph, Binding, tuple]:
    """``run`` (the forward) on the pooled graph where its output is the whole graph's (:func:`pooled_agrees`),
    else on the whole graph (whose error, if it fails too, is the one raised)."""
    try:
        done = run(*pooled)
        if pooled_agrees(whole[0], output, done[1][output], inputs):
            return *pooled, done
        failed = False
    except Exception:       # noqa: BLE001 — the whole graph runs next: its own error, or a verdict on the pooled one
        failed = True
    done = run(*whole)
    if failed:
        whole[0].cache.canonized["pooled-agrees"] = False         # these inputs run whole, not pooled
    return *whole, done


def pooled_agrees(whole: Graph, output: str, out: Tensor, inputs: Mapping[str, Any]) -> bool:
    """Whether ``out``, the output the pooled graph computed, is the whole graph's for ``inputs`` within the
    dtype's tolerance: checked on the first explanation of ``whole`` and remembered (a graph whose rows do not
    work as :func:`rulegraph.canonize.rows.pooled` reads them fails here, or in the forward, not later)."""
    cache = whole.cache.canonized
    if "pooled-agrees" not in cache:
        try:
            expected = prepare(whole, out.device, out.dtype).run(inputs, keep=frozenset({output}))[output]
            cache["pooled-agrees"] = expected.shape == out.shape and bool(torch.allclose(
                out, expected, rtol=tolerance(out.dtype), atol=tolerance(out.dtype) * float(expected.abs().max())))
        except Exception:       # noqa: BLE001 — the whole graph's own error comes when it runs again
            cache["pooled-agrees"] = False
    return cache["pooled-agrees"]


#: ``score=PROBABILITY``: explain a final Softmax's (LogSoftmax's) output itself, not its logits
PROBABILITY = "probability"
#: what ``score=`` takes: the objective's quantities, and the probability a final Softmax gives
SCORES = (*QUANTITIES, PROBABILITY)


@dataclass
class Admitted:
    """What :func:`admit` decided: the graph as explained (one output where it had to be chosen), its
    binding, the explained value, the output asked for (``asked``) and the graph's first output, and the
    final Softmax / LogSoftmax moved before (``final``: its op, its output, the logits), if any."""

    graph: Graph
    binding: Binding
    output: str
    asked: str
    first: str
    final: dict | None = None


def admit(graph: Graph, ruleset: RuleSet, output: str | None = None, score: str = "logit") -> Admitted:
    """Whether ``ruleset`` can explain ``output`` of ``graph`` (default its first output), decided in the
    one order ``explain`` and ``check`` share, each refusal one line: an op without an implementation,
    no relevance boundary, then the output (not a value of the graph, or not depending on the boundary:
    the message lists the outputs that do), then the rules of the graph as explained (a rule that cannot
    apply, a node without one). An output a final Softmax or LogSoftmax produces is explained as that
    node's input, the logits, unless ``score="probability"``; a value that is not the graph's only output
    becomes it (:func:`rulegraph.final_softmax.only`)."""
    missing = unsupported(graph.nodes)
    if missing:
        (domain, op), names = next(iter(missing.items()))
        lookup(op, domain, node=names[0], opset=graph.opset)            # raises, naming the node, op and opset
    whole = ruleset.bind(graph)                                         # the boundary, or an error naming why none
    first, asked = graph.outputs[0], output or graph.outputs[0]
    explainable = [o for o in graph.outputs if o in whole.tainted]
    choose = (f"outputs that can be explained: {', '.join(map(repr, explainable))} (or any float value computed "
              f"from the boundary)" if explainable else "no graph output depends on it")
    if asked not in graph.producer and asked not in graph.input_names and asked not in graph.constants:
        raise InputError(f"{graph.source or graph.name}: no value named {asked!r} in the graph; {choose}")
    if asked not in whole.tainted:
        raise InputError(f"{graph.source or graph.name}: output {asked!r} does not depend on the relevance boundary "
                         f"({', '.join(sorted(set(whole.boundary.values())))}); {choose}")
    explained, final = explained_value(graph, asked, score)
    if final is not None or explained not in graph.outputs:
        graph = only(graph, explained)
    binding = ruleset.bind(graph)
    binding.require_complete()
    return Admitted(graph, binding, explained, asked, first, final)


def explained_value(graph: Graph, asked: str, score: str = "logit") -> tuple[str, dict | None]:
    """The value explained for the output ``asked``, and the final Softmax / LogSoftmax moved before (its op,
    its output, the logits), if any: the logits that node reads, unless ``score="probability"``, which keeps
    ``asked`` and is refused where no such node produces it. The one decision every method (rule sets in
    :func:`admit`, baselines in :func:`rulegraph.methods.explain_with`) takes."""
    node = final_node(graph, asked)
    if score == PROBABILITY and node is None:
        producer = graph.producer.get(asked)
        raise InputError(f"score={PROBABILITY!r} explains the output of a final Softmax or LogSoftmax; {asked!r} is "
                         f"computed by {f'{producer.op} node {producer.name!r}' if producer else 'no node'}; "
                         f"valid scores for it: {', '.join(QUANTITIES)}")
    if node is None or score == PROBABILITY:
        return asked, None
    return node.inputs[0], {"op": node.op, "output": asked, "logits": node.inputs[0]}


def has_batch_axis(out: Tensor, inputs: Mapping[str, Any], output: str) -> bool:
    """Whether ``out``'s leading dim is the inputs' batch (the leading dim of the inputs that have one). One
    that is not is one item's value without its batch axis; a batch of more than one item is then refused,
    since the output cannot say which item it belongs to."""
    shapes = [tuple(v.shape) if hasattr(v, "shape") else tuple(torch.as_tensor(v).shape) for v in inputs.values()]
    batches = {s[0] for s in shapes if s}
    if out.dim() == 0 or not batches or out.shape[0] in batches:
        return True
    if batches != {1}:
        raise InputError(f"output {output!r} (shape {tuple(out.shape)}) has no batch axis: its leading dim is not "
                         f"the inputs' batch ({', '.join(map(str, sorted(batches)))}); give one item at a time")
    return False


def rule_failed(apply, site, node, where: str):
    """``apply(site)``, with an error that is not a :class:`~rulegraph.errors.RulegraphError` turned into
    one naming the node, its op and the rule's ``file:line``."""
    try:
        return apply(site)
    except RulegraphError:
        raise
    except Exception as exc:       # noqa: BLE001 — a rule failing on these values: say where
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelError(f"{where}: the rule of node {node.name!r} ({node.op}) failed: {type(exc).__name__}: "
                         f"{reason}") from exc


def boundary_map(binding: Binding, plan: Plan, values: Values) -> BoundaryMap:
    """The run's :class:`~rulegraph.boundary.BoundaryMap`, after refusing a float value that depends on a
    lookup's input by index arithmetic and would absorb relevance (:func:`rulegraph.boundary.absorbing`)."""
    lines = absorbing(binding, values)
    if lines:
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        raise ModelError(f"{lines[0]}{more}")
    return origins(binding, plan, values)


#: ``contrast=RUNNER_UP``: subtract, per item, the highest logit other than the target's
RUNNER_UP = "runner-up"


def check_arguments(inputs: Any, target: Any, position: Any, contrast: Any = None, score: Any = "logit",
                    objective: Any = None) -> None:
    """The API's arguments have the types they need, before any work."""
    if objective is not None:
        if not isinstance(objective, Objective):
            raise InputError(f"objective must be parsed by rulegraph.objective.parse, got a {type(objective).__name__}")
        if target is not None or contrast is not None or score != "logit":
            raise InputError("give an objective, or target / contrast / score, not both (the objective names "
                             "its tokens)")
    if not isinstance(inputs, Mapping):
        raise InputError(f"inputs must be a dict of model input name → tensor, got a {type(inputs).__name__}")
    bad = [k for k in inputs if not isinstance(k, str)]
    if bad:
        raise InputError(f"inputs must be keyed by input name (str), got the key {bad[0]!r}")
    items = [target] if target is None or _is_index(target) else target
    if isinstance(target, (str, bytes)) or not isinstance(items, (list, tuple)) or \
            not all(t is None and target is None or _is_index(t) for t in items):
        raise InputError(f"target must be a class index (int) or a list of them, one per batch item; got {target!r}")
    if position is not None and (isinstance(position, (str, bytes)) or not (
            _is_index(position) or isinstance(position, (list, tuple)) and all(_is_index(p) for p in position))):
        raise InputError(f"position must be an int or a list of them, one per batch item; got {position!r}")
    if contrast is not None and contrast != RUNNER_UP and (isinstance(contrast, (str, bytes)) or not (
            _is_index(contrast) or isinstance(contrast, (list, tuple)) and all(_is_index(c) for c in contrast))):
        raise InputError(f"contrast must be a class index (int), a list of them (one per batch item) or "
                         f"{RUNNER_UP!r}; got {contrast!r}")
    if not isinstance(score, str) or score not in SCORES:
        raise InputError(f"score must be one of {', '.join(SCORES)}; got {score!r}")


def runner_up(picked: Tensor, targets: list[int]) -> list[int]:
    """Per item of ``[batch, classes]``, the class with the highest value other than its target."""
    if picked.shape[-1] < 2:
        raise InputError("contrast='runner-up' needs an output with at least 2 classes")
    rest = picked.detach().clone()
    rest[torch.arange(rest.shape[0]), targets] = -torch.inf
    return rest.argmax(-1).tolist()


def _per_item(index: Any, batch: int) -> list[int]:
    return [int(index)] * batch if _is_index(index) else [int(i) for i in index]


def _is_index(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) or \
        isinstance(value, Tensor) and value.dim() == 0 and not value.is_floating_point()


def select(out: Tensor, target, position, contrast=None, score: str = "logit",
           objective: Objective | None = None, *,
           rows: Sequence[int] | None = None) -> tuple[Tensor, list[int], int | list[int] | None]:
    """The seed of the explained scalar per batch item, the targets and the position (an int, or
    for ``[batch, positions, classes]`` outputs one per batch item when a list is given): one-hot at
    the target; with ``contrast``, +1 at the target and −1 at the contrast; with
    ``score="logprob"`` (and no contrast), ``e_target − softmax`` over the classes, the
    softmax held constant; with an ``objective``, its weights (the targets reported are its
    first term's token; for a span objective, whose terms name their positions, the position
    reported is the last of them; see the module docstring). ``rows``: the positions ``out``'s rows hold
    (:attr:`Forward.rows`): the positions given and returned are the model's, read through them."""
    if rows is not None:
        span = objective is not None and objective.positions is not None
        row = len(rows) - 1 if position is None and not span else row_of(position, rows)
        seed, targets, at = select(out, target, row, contrast, score, objective and objective.at_rows(rows))
        return seed, targets, rows[at] if _is_index(at) else [rows[a] for a in at]
    shape = out.shape
    if objective is not None and objective.region is not None:     # a map's sum over a region: no class, no position
        if position is not None:
            raise InputError(f"position {position} was given, but the objective {objective.text!r} sums a region")
        return objective.region_seed(out), [0] * out.shape[0], None
    if objective is not None and objective.positions is not None:  # a span: each term at its own position
        if position is not None:
            raise InputError(f"position {position} was given, but the objective {objective.text!r} names the "
                             "position of each term (@N)")
        return objective.seed(out), [objective.terms[0].token] * out.shape[0], objective.positions[-1]
    if out.dim() == 1:
        out = out.unsqueeze(-1)
    batch = out.shape[0]
    picked = out
    if out.dim() == 3:
        positions = [out.shape[1] - 1] * batch if position is None else _per_item(position, batch)
        if len(positions) != batch:
            raise InputError(f"got {len(positions)} positions for a batch of {batch}")
        bad = [p for p in positions if not 0 <= p < out.shape[1]]
        if bad:
            raise InputError(f"position {bad[0]} is out of range; the output has {out.shape[1]} positions "
                             f"(0…{out.shape[1] - 1})")
        position = positions[0] if position is None or _is_index(position) else positions
        picked = out[torch.arange(batch), positions]
    elif position is not None:
        raise InputError(f"position {position} was given, but the output (shape {tuple(shape)}) has no positions; "
                         "it applies to [batch, positions, classes] outputs")
    elif out.dim() != 2:
        raise InputError(f"cannot pick a target in an output of shape {tuple(out.shape)}; "
                         "expected [batch, classes] or [batch, positions, classes]")
    classes = picked.shape[-1]
    if objective is not None:
        objective.check(classes)
        target = objective.terms[0].token
    if target is None:
        targets = picked.argmax(-1).tolist()
    else:
        targets = [int(target)] * batch if isinstance(target, int) else [int(t) for t in target]
        if len(targets) != batch:
            raise InputError(f"got {len(targets)} targets for a batch of {batch}")
        bad = [t for t in targets if not 0 <= t < classes]
        if bad:
            raise InputError(f"target {bad[0]} is out of range; the output has {classes} classes (0…{classes - 1})")
    seed = torch.zeros_like(picked)
    seed[torch.arange(batch), targets] = 1
    if objective is not None:
        seed = objective.seed(picked)
    elif contrast is not None:
        contrasts = runner_up(picked, targets) if contrast == RUNNER_UP else _per_item(contrast, batch)
        if len(contrasts) != batch:
            raise InputError(f"got {len(contrasts)} contrast classes for a batch of {batch}")
        bad = [c for c in contrasts if not 0 <= c < classes]
        if bad:
            raise InputError(f"contrast {bad[0]} is out of range; the output has {classes} classes (0…{classes - 1})")
        same = [t for t, c in zip(targets, contrasts) if t == c]
        if same:
            raise InputError(f"contrast {same[0]} is the target itself; the contrast must be another class "
                             "(target − contrast would be 0)")
        seed[torch.arange(batch), contrasts] = -1
    elif score == "logprob":
        if classes < 2:
            raise InputError("score='logprob' needs an output with at least 2 classes (a softmax over one is constant)")
        seed = seed - picked.detach().softmax(-1)
    if out.dim() == 3:
        full = torch.zeros_like(out)
        full[torch.arange(batch), positions] = seed
        seed = full
    return seed.reshape(shape), targets, position


def position_scores(r: Tensor) -> Tensor:
    """Per-position scores: sum over the hidden dim of ``[batch, positions, hidden]``,
    over channels of images ``[batch, channels, h, w]``; other shapes as they are."""
    if r.dim() == 3:
        return r.sum(-1)
    if r.dim() == 4:
        return r.sum(1)
    return r
