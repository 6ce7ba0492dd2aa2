"""``ig``: integrated gradients at the embeddings, all quadrature steps batched through
:meth:`Plan.run` ``overrides``."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ...boundary import origins, walk
from ...errors import InputError
from ...explanation import Explanation
from ...passes.base import select
from ..base import Option, Request, baseline
from ..sequences import fixed_batch, token_input
from .common import BATCH_TOKENS, by_key, explanation, fixed_chunks, forward, gi_binding, gradients, never_perturbed

Tensor = torch.Tensor


@baseline("ig", "integrated gradients (Sundararajan et al. 2017) at the embeddings: (x − x′) ⊙ ∫ ∂f/∂x along "
          "the straight path, Gauss–Legendre quadrature with `steps` nodes, all steps batched",
          Option("steps", int, 32, "quadrature nodes (forward + gradient passes per example)"),
          Option("baseline", str, "auto", "x′: zero embeddings, or the embeddings of the text with every "
                 "non-special token replaced by [PAD] / [UNK] / [MASK]; auto = pad when the tokenizer is known, "
                 "else zero", ("auto", "zero", "pad", "unk", "mask")),
          additive=True)
def integrated_gradients(req: Request, steps: int, baseline: str) -> Explanation:
    if steps < 1:
        raise InputError("option ig.steps must be at least 1")
    binding = gi_binding(req)
    values = list(binding.boundary)        # graph order: the explanation's keys must not follow hash order
    env, out, targets, position = forward(req, frozenset(values) | walk(req.graph).path_values())
    mapping = origins(binding, req.plan, env)
    crossed = [v for v in values if not mapping.batch_first(v)]
    if crossed:
        raise InputError(f"ig interpolates the boundary values batch item by batch item, but {crossed[0]!r} does not "
                         "hold the batch in dim 0 (the model moves its ids' batch axis); use gi or a rule set")
    x = {v: env[v] for v in values}
    base = _ig_baseline(req, x, baseline)
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    alphas = torch.tensor((nodes + 1) / 2, dtype=req.dtype)
    weights = torch.tensor(weights / 2, dtype=req.dtype)
    batch = next(iter(x.values())).shape[0]
    length = next(iter(req.inputs.values())).shape[-1] if req.inputs else 1
    rows = [(b, s) for b in range(batch) for s in range(steps)]
    total = {v: torch.zeros_like(t) for v, t in x.items()}
    for chunk, real in fixed_chunks(len(rows), BATCH_TOKENS // max(1, length), fixed_batch(req.graph)):
        bs = torch.tensor([rows[i][0] for i in chunk])
        a = alphas[[rows[i][1] for i in chunk]].to(next(iter(x.values())).device)
        inputs = {k: t[bs] for k, t in req.inputs.items()}
        overrides = {v: base[v][bs] + a.view(-1, *[1] * (x[v].dim() - 1)) * (x[v][bs] - base[v][bs]) for v in values}
        grads, _, _, _ = gradients(req, inputs, [targets[i] for i in bs.tolist()], overrides)
        w = weights[[rows[i][1] for i in chunk]].to(a.device)
        w[real:] = 0                          # rows repeated to fill a fixed batch add nothing
        for v in values:
            total[v].index_add_(0, bs.to(a.device), grads[v] * w.view(-1, *[1] * (x[v].dim() - 1)))
    attributions = {v: (x[v] - base[v]) * total[v] for v in values}
    _, base_out, _, _ = forward(req, frozenset(), overrides=base)
    seed, _, _ = select(base_out, targets, position)
    base_value = (base_out * seed).flatten(1).sum(1)
    e = explanation(req, out, targets, position, by_key(mapping, attributions), steps=steps, baseline=baseline,
                     baseline_output=base_value.double().tolist())
    total_attr = sum(t.flatten(1).sum(1) for t in attributions.values()).double()
    e.extra["completeness_gap"] = (total_attr - (torch.tensor(e.output_value, dtype=torch.float64)
                                                 - base_value.double().cpu())).tolist()
    return e


def _ig_baseline(req: Request, x: dict[str, Tensor], kind: str) -> dict[str, Tensor]:
    if kind == "auto":
        kind = "pad" if req.vocab is not None and req.vocab.pad is not None else "zero"
    if kind == "zero":
        return {v: torch.zeros_like(t) for v, t in x.items()}
    if req.vocab is None:
        raise InputError(f"ig baseline {kind!r} needs the tokenizer's special ids (explain text with a tokenizer)")
    token = {"pad": req.vocab.pad, "unk": req.vocab.unk, "mask": req.vocab.mask}[kind]
    if token is None:
        raise InputError(f"ig baseline {kind!r}: the tokenizer has no such token")
    key = token_input(req.graph)
    ids = req.inputs[key]
    replaced = torch.where(never_perturbed(req, ids).to(ids.device), ids, torch.full_like(ids, token))
    env, _, _, _ = forward(replace(req, inputs={**req.inputs, key: replaced}), frozenset(x))
    return {v: env[v] for v in x}
