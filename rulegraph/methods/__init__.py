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
    loo        leave-one-out occlusion: mode (mask | unk | delete), score (logit | prob)
    attention  raw attention of one block (default the last), head-averaged row of the
               explained position
    rollout    attention rollout (Abnar & Zuidema 2020)
    lat        layerwise attention tracing (Wu & Ong 2021, Eq. 10): unit relevance traced down
               through the head-averaged attention weights; sums to 1
    gae        generic attention-model explainability (Chefer, Gur & Wolf 2021, Eqs. 5–6)
    layer-saliency  decoded layer saliency (Hou & Castanon 2023, Alg. 1): layer, top_tau, head

Gradient×Input is the ``gi`` rule set. Every method returns an :class:`~rulegraph.Explanation`
(``audit`` is ``None`` for baselines)::

    from rulegraph.methods import explain_with
    e = explain_with(graph, "ig", inputs, steps=32)
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, choices
from ..api import Explanation, explain
from ..loaders import load
from ..ruleset import RuleSet, shipped_rule_sets
from . import baselines  # noqa: F401  (registers the baselines, in the order of its import list)
from .base import BASELINES, RELEVANCE, Method, Option, Request, baseline
from .sequences import REMOVALS, TokenModel, Tokens, Vocab, token_input

__all__ = ["BASELINES", "Method", "Option", "RELEVANCE", "Request", "REMOVALS", "TokenModel", "Tokens", "Vocab",
           "baseline", "explain_with", "get", "methods", "names", "token_input"]


#: Options of a rule set with ``pass: decomposition`` (those of ``explain --alpha/--lambda/--variant``);
#: an unset one keeps the rule file's value.
DECOMPOSITION_OPTIONS = (
    Option("alpha", str, None, "α of the bias reallocation: signed (Eq. 13), abs (Eq. 12), hybrid (Eq. 17)",
           ("signed", "abs", "hybrid")),
    Option("lambda", float, None, "threshold λ of hybrid α (Eq. 17)"),
    Option("variant", str, None, "hat (D̂, bias reallocated) or bar (D̄, bias kept apart)", ("hat", "bar")),
)


#: Options of every rule set: what is explained (``rulegraph evaluate -o NAME.score=logprob``); the API's
#: ``contrast=`` / ``target_score=`` arguments take precedence where given.
RULES_OPTIONS = (
    Option("score", str, "logit", "explain the logit, or the log-probability (z_A − Σ p·z, p held constant)",
           ("logit", "logprob")),
    Option("contrast", str, None, "runner-up: explain z_A − z_B, B the highest other class (= log p_A − log p_B)",
           ("runner-up",)),
)


def _explained(options: dict[str, Any]) -> str:
    """What a rule set's scores are relevance of, under its options."""
    if options.get("contrast"):
        return "relevance of z − z(runner-up)"
    return "relevance of log p (p held)" if options.get("score") == "logprob" else RELEVANCE


def _rules_method(name: str) -> Method:
    description, decomposition = "", False
    try:
        rules = RuleSet.load(name)
        description, decomposition = rules.description, rules.pass_name == "decomposition"
    except Exception:  # a broken rule file is reported when it is used
        pass

    def run(request: Request, **options) -> Explanation:
        kwargs = dict(output=request.output, position=request.position, device=request.device, dtype=request.dtype,
                      audit=request.audit)
        contrast = request.contrast if request.contrast is not None else options.pop("contrast", None)
        score = request.score if request.score != "logit" else options.pop("score", "logit")
        if contrast is not None or score != "logit":
            kwargs.update(contrast=contrast, score=score)
        if request.objective is not None:
            kwargs.update(objective=request.objective)
        if decomposition:
            return explain(request.graph, RuleSet.load(name), request.inputs, request.target, alpha=options["alpha"],
                             threshold=options["lambda"], variant=options["variant"], **kwargs)
        return explain(request.graph, RuleSet.load(name), request.inputs, request.target, **kwargs)
    return Method(name, description.strip() or f"rule set {name}", run,
                  (*RULES_OPTIONS, *(DECOMPOSITION_OPTIONS if decomposition else ())), "rules", True, _explained)


def names() -> list[str]:
    """Every method name: the baselines, then the shipped rule sets."""
    return [*BASELINES, *sorted(n for n in shipped_rule_sets() if n not in BASELINES)]


def methods() -> dict[str, Method]:
    """Name → :class:`Method` for the baselines and every shipped rule set (read now, so rule
    sets added later appear)."""
    return {**dict(BASELINES.items()), **{n: _rules_method(n) for n in sorted(shipped_rule_sets()) if n not in BASELINES}}


def get(name: str) -> Method:
    """The method called ``name``: a baseline, a shipped rule set, or a path to a YAML rule file; or
    ``LABEL=METHOD``, that method under another name, so that one evaluation can compare a method with
    itself under other options (``--methods lp=lrp-ah-ln,lrp-ah-ln -o lp.score=logprob``)."""
    label, alias, base = name.partition("=")
    if alias:
        if not label or not base or "," in label:
            raise InputError(f"method {name!r}: write LABEL=METHOD, e.g. lrp-logprob=lrp-ah-ln")
        if label in BASELINES or label in shipped_rule_sets():
            raise InputError(f"method label {label!r} is already a method's name; choose another")
        return replace(get(base), name=label)
    if name in BASELINES:
        return BASELINES.get(name)
    if name in shipped_rule_sets():
        return _rules_method(name)
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise InputError(f"rule file not found: {path}")
        return _rules_method(str(path))
    raise InputError(f"unknown method {name!r}; {choices(names(), name)}, or a path to a .yaml rule file")


def explain_with(model: Any, method: str | Method, inputs: dict[str, Any], target=None, *, output: str | None = None,
                 position: int | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 special: torch.Tensor | None = None, vocab: Vocab | None = None, audit: bool = True,
                 contrast=None, target_score: str = "logit", objective=None, **options) -> Explanation:
    """Explain ``model``'s output for ``inputs`` with a method (name or :class:`Method`).

    ``special``: ``[batch, tokens]`` booleans marking special tokens (never perturbed by
    leave-one-out or token baselines); ``vocab``: the tokenizer's [PAD]/[UNK]/[MASK] ids.
    ``options``: the method's declared options (see ``rulegraph methods``). ``contrast``,
    ``target_score`` and ``objective``: ``contrast``, ``score`` and ``objective`` of
    :func:`rulegraph.explain` (``target_score`` named so as not to take a method's own ``score``
    option); rule sets only (baselines refuse them).
    """
    m = method if isinstance(method, Method) else get(method)
    if (contrast is not None or target_score != "logit" or objective is not None) and m.kind != "rules":
        raise InputError(f"contrast, score='logprob' and objective are supported by rule sets; {m.name} is a baseline")
    resolved = m.resolve(options)
    graph = load(model)
    feeds = {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in inputs.items()}
    request = Request(graph, feeds, target, output, position, device, dtype, special, vocab, audit, contrast, target_score,
                      objective)
    e = m.run(request, **resolved)
    e.rules = m.name
    e.extra.setdefault("method", m.name)
    if resolved:
        e.extra.setdefault("options", resolved)
    return e
