"""What the baselines share: the explanation they return, forwards through the interpreter,
∂f/∂x at the boundary by the ``gi`` relevance pass, and the positions never perturbed.

Every function here reads the graph, the binding and the plan the :class:`~rulegraph.methods.base.Request`
holds (the graph as the method's rule set sees it, canonized; bound once): none loads, canonizes or
binds a graph."""
from __future__ import annotations

import torch

from ...boundary import BoundaryMap, origins
from ...errors import RulegraphError
from ...explanation import Explanation
from ...passes.base import labels, position_scores, select
from ...passes.relevance import walk
from ..base import Request

Tensor = torch.Tensor

#: Padded tokens per interpreter run when a method batches many rows (IG steps, LOO).
BATCH_TOKENS = 4096


def explanation(req: Request, out: Tensor, targets: list[int], position: int | None,
                 boundary: dict[str, Tensor], relevance: dict[str, Tensor] | None = None, **extra) -> Explanation:
    seed, _, _ = select(out, targets, position)
    explained = (out * seed).flatten(1).sum(1) if out.dim() > 1 else out * seed
    boundary = {k: v.detach().cpu() for k, v in boundary.items()}
    return Explanation(
        output=req.output or req.graph.outputs[0], output_tensor=out.detach().cpu(), target=targets,
        position=position, output_value=explained.double().tolist(),
        relevance=relevance if relevance is not None else {k: position_scores(v) for k, v in boundary.items()},
        boundary=boundary, method="", audit=None, labels=labels(req.graph), extra=dict(extra))


def _given(req: Request, inputs: dict[str, Tensor], overrides: dict[str, Tensor] | None):
    """``inputs`` and ``overrides`` as the interpreter takes them: a boundary value that is a graph input (the
    float input of an image or audio model, its pixels or samples) is overridden by giving it as that input."""
    if not overrides:
        return inputs, overrides
    names = set(req.graph.input_names)
    return ({**inputs, **{v: t for v, t in overrides.items() if v in names}},
            {v: t for v, t in overrides.items() if v not in names})


def forward(req: Request, keep: frozenset[str], overrides=None) -> tuple[dict, Tensor, list[int], int | None]:
    """The forward values ``keep``, the output, the targets and the position, on the request's graph
    (``overrides``: boundary values replaced, :func:`_given`)."""
    output = req.output or req.graph.outputs[0]
    with torch.no_grad():
        inputs, overrides = _given(req, req.inputs, overrides)
        env = req.plan.run(inputs, keep=keep, overrides=overrides)
    out = env[output]
    _, targets, position = select(out, req.target, req.position)
    return env, out, targets, position


def gi_walk(req: Request, inputs: dict[str, Tensor], target, *, overrides=None, record=frozenset()):
    """The ``gi`` relevance pass without the audit (its relevance at a value ``v`` is
    ``v ⊙ ∂(explained output)/∂v``): the binding, the forward values, the output, the targets,
    the position, and the walk's :class:`~rulegraph.passes.relevance.Flow` (recording at ``record``).
    The request's rule set is ``gi`` (the baseline's default)."""
    binding, plan = gi_binding(req), req.plan
    output = req.output or req.graph.outputs[0]
    with torch.no_grad():
        inputs, overrides = _given(req, inputs, overrides)
        env = plan.run(inputs, keep=binding.needed_values | record, overrides=overrides)
        out = env[output]
        seed, targets, position = select(out, target, req.position)
        flow = walk(binding, plan, env, output, seed, audit=False, record_at=record)
    return binding, env, out, targets, position, flow


def gi_binding(req: Request):
    """The request's binding, refused unless its rule set is ``gi`` (whose relevance is v ⊙ ∂f/∂v)."""
    if req.ruleset is None or req.ruleset.name != "gi":
        found = req.ruleset.name if req.ruleset is not None else None
        raise RulegraphError(f"the gradient baselines read the gi relevance pass; this method declares the rule set "
                             f"{found!r} (declare rules='gi' in @baseline)")
    return req.binding


def gradients(req: Request, inputs: dict[str, Tensor], targets: list[int], overrides=None):
    """∂(explained output)/∂(each boundary value) by the ``gi`` relevance pass; also returns the
    boundary values, the output and the run's :class:`~rulegraph.boundary.BoundaryMap`."""
    binding, env, out, _, _, flow = gi_walk(req, inputs, targets, overrides=overrides)
    mapping = origins(binding, req.plan, env)
    grads = {}
    for v in binding.boundary:
        g = flow.signals.get(v)
        if g is None and v in flow.boundary:
            raise RulegraphError(f"the gi pass reached {v!r} with explicit relevance, so its gradient cannot be read")
        grads[v] = torch.zeros_like(env[v]) if g is None else g
    return grads, {v: env[v] for v in binding.boundary}, out, mapping


def gradient_times_value(req: Request, values: list[str]) -> tuple[dict[str, Tensor], dict, Tensor, list[int], int | None]:
    """v ⊙ ∂(explained output)/∂v at intermediate values ``v`` (attention probabilities, hidden
    states): the ``gi`` relevance pass's relevance recorded at ``v`` (``walk(record_at=...)``) once
    every consumer of ``v`` has handed its share, i.e. with the total derivative through every path.

    Overriding ``v`` with a leaf tensor (``Plan.run(overrides=...)``) and running autograd would
    not give this for several values at once: a leaf cuts the paths from the earlier values
    through it (block l's probabilities reach the output also through block l+1's softmax).
    Also returns the forward values, the output, the targets and the position.
    """
    _, env, out, targets, position, flow = gi_walk(req, req.inputs, req.target, record=frozenset(values))
    found = {v: flow.recorded[v] if v in flow.recorded else torch.zeros_like(env[v]) for v in values}
    return found, env, out, targets, position


def by_key(mapping: BoundaryMap, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Boundary value → tensor, mapped to the inputs' positions and combined into the boundary's keys
    (input names; :meth:`rulegraph.boundary.BoundaryMap.by_key`)."""
    return mapping.by_key(tensors)


def chunks(n: int, per: int):
    for start in range(0, n, max(1, per)):
        yield range(start, min(n, start + max(1, per)))


def fixed_chunks(n: int, per: int, fixed: int | None):
    """Indices ``0…n−1`` in chunks of at most ``per``, or with a ``fixed`` batch in chunks of exactly
    ``fixed`` (the last one padded by repeating its last index): ``(indices, how many are real)``."""
    if fixed is None:
        for chunk in chunks(n, per):
            yield list(chunk), len(chunk)
        return
    for start in range(0, n, fixed):
        real = list(range(start, min(n, start + fixed)))
        yield real + [real[-1]] * (fixed - len(real)), len(real)


def never_perturbed(req: Request, ids: Tensor) -> Tensor:
    """Positions never perturbed: the special tokens given, and padding."""
    special = req.special if req.special is not None else torch.zeros_like(ids, dtype=torch.bool)
    special = special.to(torch.bool).clone()
    mask = req.inputs.get("attention_mask")
    if mask is not None:
        special |= mask.to(special.device) == 0
    return special
