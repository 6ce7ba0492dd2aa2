"""Explanation methods by name: every rule set, plus the baselines users compare against.

One table maps a name to a :class:`Method`. Every shipped rule set (``rulegraph rules``)
and any YAML rule file path is a method that runs :func:`rulegraph.explain`, so rule sets
added later (AttnLRP, Mask-LRP, decomposition…) are methods without any change here. The
baselines are registered in :mod:`rulegraph.methods.baselines` (one file each) with declared
options and declared properties (:class:`~rulegraph.methods.base.Method`: ``additive``, the
``score`` quantity, ``seeded``, ``reference``), so nothing elsewhere branches on a name:

    random     seeded random scores
    gs         gradient sensitivity ‖∂f/∂x‖₂ per token (Li et al. 2016; Wu & Ong 2021 Eq. 1)
    ig         integrated gradients (Sundararajan et al. 2017): steps, baseline
    loo        leave-one-out occlusion: mode (mask | unk | delete), drop (logit | prob)
    attention  raw attention of one block (default the last), head-averaged row of the
               explained position
    rollout    attention rollout (Abnar & Zuidema 2020)
    mask-lrp-rollout  Mask-LRP's rollout of masked attention relevance (Song et al. 2024, Eqs. 10–11):
               masks, row; mask-lrp-random its random-mask control
    lat        layerwise attention tracing (Wu & Ong 2021, Eq. 10): unit relevance traced down
               through the head-averaged attention weights; sums to 1
    gae        generic attention-model explainability (Chefer, Gur & Wolf 2021, Eqs. 5–6)
    layer-saliency  decoded layer saliency (Hou & Castanon 2023, Alg. 1): layer, top_tau, head

Every method reaches the graph through one prologue (:meth:`Method.prepared`: loaded, canonized
as its rule set asks, bound once), so a quantized graph reaches each as the float computation it
stands for. Gradient×Input is the ``gi`` rule set. Every method returns an :class:`~rulegraph.Explanation`
(``audit`` is ``None`` for baselines)::

    from rulegraph.methods import explain_with
    e = explain_with(graph, "ig", inputs, steps=32)
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import InputError, RuleFileError, choices
from ..explanation import Explanation
from ..interpreter import as_tensor
from ..options import INSIDE_OPTIONS, PASS_OPTIONS, RULE_SET_OPTIONS
from ..passes import apply, apply_targets
from ..canonize.final_softmax import only
from ..inside import several
from ..passes.base import PROBABILITY, check_arguments, explained_value, target_sets
from ..ruleset import RuleSet, shipped_rule_sets
from . import baselines  # noqa: F401  (registers the baselines, in the order of its import list)
from .base import BASELINES, RELEVANCE, Method, Option, Request, baseline
from .sequences import REMOVALS, TokenModel, Tokens, Vocab, token_input

__all__ = ["BASELINES", "Method", "Option", "RELEVANCE", "Request", "REMOVALS", "TokenModel", "Tokens", "Vocab",
           "baseline", "explain_with", "explained", "get", "methods", "names", "token_input"]


def _rules_method(rules: str | RuleSet) -> Method:
    """A rule set (a name, a YAML path or a :class:`RuleSet`) as a method: its options are those
    of the pass it runs (the command line's flags)."""
    description, pass_name = "", "relevance"
    loaded = rules if isinstance(rules, RuleSet) else None
    name = (rules.name or rules.source) if loaded is not None else rules
    try:
        loaded = loaded or RuleSet.load(name)
        description, pass_name = loaded.description, loaded.pass_name
    except Exception:  # a broken rule file is reported when it is used
        pass

    def run(request: Request, **options) -> Explanation:
        return apply(request.graph, request.ruleset, request.inputs, request.target, **_rules_arguments(request, options))
    declared = (*RULE_SET_OPTIONS, *PASS_OPTIONS.get(pass_name, ()))
    return Method(name, description.strip() or f"rule set {name}", run, declared, True, True, _unit,
                  rules=rules if isinstance(rules, RuleSet) else name)


def _rules_arguments(request: Request, options: dict[str, Any]) -> dict[str, Any]:
    """What :func:`~rulegraph.passes.apply` takes of a request and a rule set's options."""
    kwargs = dict(output=request.output, position=request.position, device=request.device, dtype=request.dtype,
                  audit=request.audit)
    if request.contrast is not None or request.score != "logit":
        kwargs.update(contrast=request.contrast, score=request.score)
    if request.objective is not None:
        kwargs.update(objective=request.objective)
    return {**kwargs, **{k: v for k, v in options.items() if v is not None}}


def explained(options: dict[str, Any], contrast=None, score: str | None = "logit") -> tuple[Any, str]:
    """What a rule set explains, settled in this one place: ``contrast`` and ``score`` given to the
    call (:func:`rulegraph.explain`'s, the command line's ``--contrast`` / ``--score``) where given,
    else the rule set's options of those names (``-o NAME.score=logprob``), which are taken out of
    ``options``."""
    option_contrast, option_score = options.pop("contrast", None), options.pop("score", None)
    return (contrast if contrast is not None else option_contrast,
            score if score not in (None, "logit") else option_score or "logit")


def _unit(options: dict[str, Any]) -> str:
    """What a rule set's scores are relevance of, under its options."""
    if options.get("contrast"):
        return "relevance of z − z(runner-up)"
    return "relevance of log p (p held)" if options.get("score") == "logprob" else RELEVANCE


def names() -> list[str]:
    """Every method name: the baselines, then the shipped rule sets."""
    return [*BASELINES, *sorted(n for n in shipped_rule_sets(None) if n not in BASELINES)]


def methods() -> dict[str, Method]:
    """Name → :class:`Method` for the baselines and every shipped rule set (read now, so rule
    sets added later appear)."""
    return {**dict(BASELINES.items()), **{n: _rules_method(n) for n in sorted(shipped_rule_sets(None)) if n not in BASELINES}}


def get(name: str | RuleSet) -> Method:
    """The method called ``name``: a baseline, a shipped rule set, a path to a YAML rule file, or
    a :class:`RuleSet` object; or ``LABEL=METHOD``, that method under another name, so that one
    evaluation can compare a method with itself under other options (``--methods
    lp=lrp-ah-ln,lrp-ah-ln -o lp.score=logprob``)."""
    if isinstance(name, RuleSet):
        return _rules_method(name)
    if not isinstance(name, (str, Path)):
        raise InputError(f"a method is a name (see `rulegraph methods`), a rule file path or a RuleSet; "
                         f"got a {type(name).__name__}")
    name = str(name)
    label, alias, base = name.partition("=")
    if alias and not Path(name).exists():
        if not label or not base or "," in label:
            raise InputError(f"method {name!r}: write LABEL=METHOD, e.g. lrp-logprob=lrp-ah-ln")
        if label in BASELINES or label in shipped_rule_sets(None):
            raise InputError(f"method label {label!r} is already a method's name; choose another")
        return replace(get(base), name=label)
    if name in BASELINES:
        return BASELINES.get(name)
    if name in shipped_rule_sets(None):
        return _rules_method(name)
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise RuleFileError(f"rule file not found: {path}")
        return _rules_method(str(path))
    raise InputError(f"unknown method {name!r}; {choices(names(), name)}, or a path to a .yaml rule file")


def explain_with(model: Any, method: str | Method, inputs: dict[str, Any], target=None, *, output: str | None = None,
                 position: int | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 special: torch.Tensor | None = None, vocab: Vocab | None = None, audit: bool = True,
                 contrast=None, target_score: str = "logit", objective=None, targets=None, positions=None,
                 **options) -> Explanation | list[Explanation]:
    """Explain ``model``'s output for ``inputs`` with a method (name or :class:`Method`).

    ``special``: ``[batch, tokens]`` booleans marking special tokens (never perturbed by
    leave-one-out or token baselines); ``vocab``: the tokenizer's [PAD]/[UNK]/[MASK] ids.
    ``options``: the method's declared options (see ``rulegraph methods``). ``contrast``,
    ``target_score`` and ``objective``: ``contrast``, ``score`` and ``objective`` of
    :func:`rulegraph.explain` (``target_score`` named so as not to take a method's own ``score``
    option); rule sets only (baselines refuse them), but for ``target_score="probability"``. Every method
    explains the same value: an output a final Softmax or LogSoftmax produces is explained as its logits,
    a baseline's graph cut to them (``e.extra["final"]`` says so), unless ``target_score="probability"``
    (:func:`rulegraph.passes.base.explained_value`).

    ``targets`` (``"all"``, ``"top-K"`` or a list of classes; instead of ``target``): one explanation per
    target, a list. A rule set explains them from one forward and one walk
    (:func:`~rulegraph.passes.base.apply_targets`); a baseline runs once per target. ``positions``: with a
    list of targets, a rule set's only, each target's position (a continuation's steps).
    """
    m = method if isinstance(method, Method) else get(method)
    if (contrast is not None or target_score not in ("logit", PROBABILITY) or objective is not None) and not m.rule_set:
        raise InputError(f"contrast, score='logprob' and objective are supported by rule sets; {m.name} is a baseline")
    resolved = m.resolve(options)
    if m.rule_set:
        contrast, target_score = explained(resolved, contrast, target_score)
    graph, ruleset = m.prepared(model)
    final = None
    if not m.rule_set:          # as a rule set's prologue decides (passes.base.admit): a final Softmax's logits
        output, final = explained_value(graph, output or graph.outputs[0], target_score)
        graph = only(graph, output) if final is not None else graph
    if not isinstance(inputs, Mapping) or not all(isinstance(k, str) for k in inputs):
        check_arguments(inputs, None, None)             # says what is wrong with them
    feeds = {k: as_tensor(k, v) for k, v in inputs.items()}
    request = Request(graph, feeds, target, output, position, device, dtype, special, vocab, audit, contrast, target_score,
                      objective, ruleset)
    maps = m.rule_set and several(resolved.get("condition"))
    if targets is None and not maps:
        return _finished(m.run(request, **resolved), m, resolved, final)
    if targets is not None and (target is not None or contrast is not None or objective is not None):
        raise InputError("targets=… explains each of several classes; give it without target, contrast or objective")
    if maps and (contrast is not None or objective is not None):
        raise InputError("conditions with alternatives (|, each) make several maps; give them without contrast or "
                         "objective")
    if positions is not None and not m.rule_set:
        raise InputError(f"positions=… is a rule set's (one forward, one walk); {m.name} is a baseline")
    if m.rule_set:
        results = apply_targets(graph, ruleset, feeds, targets, target=target, positions=positions,
                                **_rules_arguments(request, resolved))
    else:                   # a baseline, once per target: the first run's output names them
        first = m.run(request, **resolved)
        sets = target_sets(first.output_tensor, targets, first.position, first.rows)
        results = [first if t == first.target else m.run(replace(request, target=t), **resolved) for t in sets]
    return [_finished(e, m, resolved, final) for e in results]


def _finished(e: Explanation, m: Method, resolved: dict[str, Any], final: dict | None) -> Explanation:
    """``e`` labelled with its method, the final Softmax moved before, and the options it ran with."""
    e.method = m.name
    if final is not None:
        e.extra["final"] = dict(final)
    e.extra.setdefault("method", m.name)
    shown = {o.name: resolved[o.name] for o in m.options     # not the API's inputs (word ids…), nor what
             if o.cli and o not in (*RULE_SET_OPTIONS, *INSIDE_OPTIONS)}     # e.contrast / e.extra / e.inside
                                                                                   # record already
    if shown:
        e.extra.setdefault("options", shown)
    return e
