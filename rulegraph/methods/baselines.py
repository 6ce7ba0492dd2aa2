"""The baseline methods, run through the same interpreter on the exported graph, in batches.

* ``gs`` and ``ig`` read ∂f/∂x at the embeddings from the relevance pass with the ``gi``
  rule set (its boundary signal is the gradient); IG runs the interpolated embeddings
  through :meth:`Plan.run` ``overrides``, many steps per batch.
* ``loo`` and the token baselines run perturbed token sequences through
  :class:`~rulegraph.methods.sequences.TokenModel`.
* ``attention`` and ``rollout`` read the attention probabilities: the Softmax outputs
  feeding the attention MatMul, found with the ``ah`` pattern of ``rulesets/lrp-ah.yaml``.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

from ..errors import InputError, RulegraphError
from ..explanation import Explanation
from ..interpreter import prepare
from ..ir import Graph
from ..passes.base import labels, position_scores, select
from ..passes.relevance import walk
from ..ruleset import Pattern, RuleSet
from . import Option, Request, baseline
from .sequences import ENGINES, REMOVALS, TokenModel, Tokens, token_input

Tensor = torch.Tensor

#: Padded tokens per interpreter run when a method batches many rows (IG steps, LOO).
BATCH_TOKENS = 4096
_ATTENTION_THROUGH = ("Where", "Cast", "Dropout", "Identity")


# -- shared pieces ------------------------------------------------------------------------------

def _explanation(req: Request, out: Tensor, targets: list[int], position: int | None,
                 boundary: dict[str, Tensor], relevance: dict[str, Tensor] | None = None, **extra) -> Explanation:
    seed, _, _ = select(out, targets, position)
    explained = (out * seed).flatten(1).sum(1) if out.dim() > 1 else out * seed
    boundary = {k: v.detach().cpu() for k, v in boundary.items()}
    return Explanation(
        output=req.output or req.graph.outputs[0], output_tensor=out.detach().cpu(), target=targets,
        position=position, output_value=explained.double().tolist(),
        relevance=relevance if relevance is not None else {k: position_scores(v) for k, v in boundary.items()},
        boundary=boundary, rules="", audit=None, labels=labels(req.graph), extra=dict(extra))


def _forward(req: Request, keep: frozenset[str], overrides=None) -> tuple[dict, Tensor, list[int], int | None]:
    plan = prepare(req.graph, req.device, req.dtype)
    output = req.output or req.graph.outputs[0]
    with torch.no_grad():
        env = plan.run(req.inputs, keep=keep, overrides=overrides)
    out = env[output]
    _, targets, position = select(out, req.target, req.position)
    return env, out, targets, position


def _gradients(req: Request, inputs: dict[str, Tensor], targets: list[int], overrides=None):
    """∂(explained output)/∂(each boundary value) by the ``gi`` relevance pass; also returns the
    boundary values and the output."""
    rules = RuleSet.load("gi")
    binding = rules.bind(req.graph)
    binding.require_complete()
    plan = prepare(req.graph, req.device, req.dtype)
    output = req.output or req.graph.outputs[0]
    with torch.no_grad():
        env = plan.run(inputs, keep=binding.needed_values, overrides=overrides)
        out = env[output]
        seed, _, _ = select(out, targets, req.position)
        flow = walk(binding, plan, env, output, seed, audit=False)
    grads = {}
    for v in binding.boundary:
        g = flow.signals.get(v)
        if g is None and v in flow.boundary:
            raise RulegraphError(f"the gi pass reached {v!r} with explicit relevance, so its gradient cannot be read")
        grads[v] = torch.zeros_like(env[v]) if g is None else g
    return grads, {v: env[v] for v in binding.boundary}, out, binding


def _by_key(binding, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Boundary value → tensor, summed into the boundary's keys (input names)."""
    out: dict[str, Tensor] = {}
    for v, t in tensors.items():
        key = binding.boundary[v]
        out[key] = out[key] + t if key in out else t
    return out


def _chunks(n: int, per: int):
    for start in range(0, n, max(1, per)):
        yield range(start, min(n, start + max(1, per)))


def _special(req: Request, ids: Tensor) -> Tensor:
    """Positions never perturbed: the special tokens given, and padding."""
    special = req.special if req.special is not None else torch.zeros_like(ids, dtype=torch.bool)
    special = special.to(torch.bool).clone()
    mask = req.inputs.get("attention_mask")
    if mask is not None:
        special |= mask.to(special.device) == 0
    return special


# -- random -------------------------------------------------------------------------------------

@baseline("random", "uniform random scores in [0, 1), seeded by `seed` and the token ids (so a batch "
          "gives the same scores as one-by-one)", Option("seed", int, 0, "random seed"))
def random_scores(req: Request, seed: int) -> Explanation:
    key = token_input(req.graph)
    ids = req.inputs[key]
    _, out, targets, position = _forward(req, frozenset())
    mask = req.inputs.get("attention_mask")
    rows = []
    for b in range(ids.shape[0]):
        row = ids[b] if mask is None else ids[b][mask[b] != 0]
        digest = zlib.crc32(np.asarray(row.cpu(), dtype=np.int64).tobytes(), seed & 0xFFFFFFFF)
        g = torch.Generator().manual_seed(digest)
        rows.append(torch.rand(ids.shape[1], generator=g, dtype=torch.float64))
    scores = torch.stack(rows)
    return _explanation(req, out, targets, position, {key: scores})


# -- gradients ----------------------------------------------------------------------------------

@baseline("gs", "gradient sensitivity: the L2 norm over the hidden dimension of ∂f/∂x at the embeddings "
          "(Li et al. 2016; Wu & Ong 2021 Eq. 1); unsigned")
def gradient_sensitivity(req: Request) -> Explanation:
    _, out, targets, position = _forward(req, frozenset())
    grads, _, out, binding = _gradients(req, req.inputs, targets)
    grads = _by_key(binding, grads)
    key = token_input(req.graph)    # only the token embeddings: ∂f/∂x is the same for every summand of x
    grads = {key: grads[key]} if key in grads else grads
    relevance = {k: (g.norm(dim=-1) if g.dim() == 3 else g.abs()).detach().cpu() for k, g in grads.items()}
    return _explanation(req, out, targets, position, grads, relevance)


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
    rules = RuleSet.load("gi")
    binding = rules.bind(req.graph)
    values = frozenset(binding.boundary)
    env, out, targets, position = _forward(req, values)
    x = {v: env[v] for v in values}
    base = _ig_baseline(req, x, baseline)
    nodes, weights = np.polynomial.legendre.leggauss(steps)
    alphas = torch.tensor((nodes + 1) / 2, dtype=req.dtype)
    weights = torch.tensor(weights / 2, dtype=req.dtype)
    batch = next(iter(x.values())).shape[0]
    length = next(iter(req.inputs.values())).shape[-1] if req.inputs else 1
    rows = [(b, s) for b in range(batch) for s in range(steps)]
    total = {v: torch.zeros_like(t) for v, t in x.items()}
    for chunk in _chunks(len(rows), BATCH_TOKENS // max(1, length)):
        bs = torch.tensor([rows[i][0] for i in chunk])
        a = alphas[[rows[i][1] for i in chunk]].to(next(iter(x.values())).device)
        inputs = {k: t[bs] for k, t in req.inputs.items()}
        overrides = {v: base[v][bs] + a.view(-1, *[1] * (x[v].dim() - 1)) * (x[v][bs] - base[v][bs]) for v in values}
        grads, _, _, _ = _gradients(req, inputs, [targets[i] for i in bs.tolist()], overrides)
        w = weights[[rows[i][1] for i in chunk]].to(a.device)
        for v in values:
            total[v].index_add_(0, bs.to(a.device), grads[v] * w.view(-1, *[1] * (x[v].dim() - 1)))
    attributions = {v: (x[v] - base[v]) * total[v] for v in values}
    _, base_out, _, _ = _forward(req, frozenset(), overrides=base)
    seed, _, _ = select(base_out, targets, position)
    base_value = (base_out * seed).flatten(1).sum(1)
    e = _explanation(req, out, targets, position, _by_key(binding, attributions), steps=steps, baseline=baseline,
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
    replaced = torch.where(_special(req, ids).to(ids.device), ids, torch.full_like(ids, token))
    env, _, _, _ = _forward(Request(**{**req.__dict__, "inputs": {**req.inputs, key: replaced}}), frozenset(x))
    return {v: env[v] for v in x}


# -- occlusion ----------------------------------------------------------------------------------

@baseline("loo", "leave-one-out occlusion: f(x) − f(x without token i) for each non-special token, the "
          "perturbed sequences batched",
          Option("mode", str, "mask", "how the token is removed: replaced by [MASK] (or [UNK] without one), "
                 "by [UNK], or deleted", REMOVALS),
          Option("score", str, "logit", "difference of the explained logit or of its softmax probability",
                 ("logit", "prob")),
          Option("engine", str, "auto", "what runs the perturbed forwards: auto (onnxruntime for an ONNX file "
                 "on the CPU in float32, else the interpreter), rulegraph, onnxruntime", ENGINES))
def leave_one_out(req: Request, mode: str, score: str, engine: str) -> Explanation:
    if mode != "delete" and req.vocab is None:
        raise InputError(f"loo mode {mode!r} needs the tokenizer's [MASK]/[UNK] ids; explain text with a tokenizer "
                         "or use -o loo.mode=delete")
    replacement = req.vocab.replacement(mode) if mode != "delete" else None
    key = token_input(req.graph)
    ids = req.inputs[key]
    _, out, targets, position = _forward(req, frozenset())
    if out.dim() != 2:
        raise InputError("loo needs a [batch, classes] output")
    special = _special(req, ids)
    mask = req.inputs.get("attention_mask")
    types = req.inputs.get("token_type_ids")
    model = TokenModel(req.graph, output=req.output, device=req.device, dtype=req.dtype,
                       pad_id=req.vocab.pad if req.vocab else 0, batch_tokens=BATCH_TOKENS, engine=engine)
    seqs, where = [], []
    for b in range(ids.shape[0]):
        n = int(mask[b].sum()) if mask is not None else ids.shape[1]
        tokens = Tokens(tuple(ids[b, :n].tolist()), tuple(types[b, :n].tolist()) if types is not None else None)
        seqs.append(tokens)
        where.append((b, None))
        for i in range(n):
            if not special[b, i]:
                seqs.append(tokens.remove([i], replacement))
                where.append((b, i))
    logits = model(seqs)
    value = logits if score == "logit" else logits.softmax(-1)
    scores = torch.zeros(ids.shape, dtype=torch.float64)
    reference = {}
    for (b, i), row in zip(where, value):
        if i is None:
            reference[b] = row[targets[b]]
        else:
            scores[b, i] = reference[b] - row[targets[b]]
    return _explanation(req, out, targets, position, {key: scores}, mode=mode, score=score)


# -- attention ----------------------------------------------------------------------------------

def attention_values(graph: Graph) -> list[str]:
    """The attention probabilities (Softmax outputs feeding an attention MatMul), in block order.

    Found with the pattern of the ``ah`` entry of ``rulesets/lrp-ah.yaml`` (probabilities ×
    values: a MatMul whose input 0 comes from a Softmax, possibly through Where/Cast/Dropout).
    """
    if graph.cache.attention is not None:
        return graph.cache.attention
    rules = RuleSet.load("lrp-ah")
    entries = [e for e in rules.entries if e.rule.name == "ah" and e.inputs]
    found: list[str] = []
    for node in graph.nodes:
        entry = next((e for e in entries if e.matches(graph, node)), None)
        if entry is None:
            continue
        k, pattern = next(iter(entry.inputs.items()))
        value = _trace(graph, node.inputs[k], pattern)
        if value is not None and value not in found:
            found.append(value)
    if not found:
        raise InputError("no attention found: no MatMul fed by a Softmax (the `ah` pattern of rulesets/lrp-ah.yaml)")
    graph.cache.attention = found
    return found


def _trace(graph: Graph, value: str, pattern: Pattern) -> str | None:
    """The output of the producer ``pattern`` matched, walking back through its ``through`` ops."""
    for _ in range(64):
        producer = graph.producer.get(value)
        if producer is None:
            return None
        if producer.op in pattern.sources:
            return producer.outputs[0]
        if producer.op not in (pattern.through or _ATTENTION_THROUGH):
            return None
        candidates = producer.inputs[1:] if producer.op == "Where" else producer.inputs
        value = next((v for v in candidates if v and v not in graph.constant_values), None)
        if value is None:
            return None
    return None


def _rows(req: Request, row: int, batch: int, length: int) -> list[int]:
    """The query position per item: ``row``, or for ``row < 0`` counted back from the last real token."""
    if row >= 0:
        if row >= length:
            raise InputError(f"attention row {row} is outside the {length} positions")
        return [row] * batch
    mask = req.inputs.get("attention_mask")
    lengths = [int(m.sum()) for m in mask] if mask is not None else [length] * batch
    return [n + row for n in lengths]


def _attention(req: Request) -> tuple[list[Tensor], Tensor, list[int], int | None]:
    values = attention_values(req.graph)
    env, out, targets, position = _forward(req, frozenset(values))
    probs = [env[v].to(torch.float64) for v in values]
    for p in probs:
        if p.dim() != 4:
            raise InputError(f"attention probabilities of shape {tuple(p.shape)}; expected [batch, heads, q, k]")
    return probs, out, targets, position


@baseline("attention", "raw attention: the head-averaged attention row of the explained position in one "
          "block (default the last)",
          Option("block", int, -1, "which attention block (0-based; negative counts from the last)"),
          Option("row", int, 0, "query position read: 0 = [CLS] (BERT-style classifiers); negative counts back "
                 "from the last real token (−1 for decoder classifiers)"))
def raw_attention(req: Request, block: int, row: int) -> Explanation:
    probs, out, targets, position = _attention(req)
    if not -len(probs) <= block < len(probs):
        raise InputError(f"attention block {block} does not exist; the model has {len(probs)} (0…{len(probs) - 1})")
    a = probs[block].mean(1)
    rows = _rows(req, row, a.shape[0], a.shape[1])
    scores = torch.stack([a[b, r] for b, r in enumerate(rows)]).cpu()
    key = token_input(req.graph)
    return _explanation(req, out, targets, position, {key: scores}, block=block % len(probs))


def rollout_matrix(probs: list[Tensor], residual: float = 0.5) -> Tensor:
    """Abnar & Zuidema (2020): Â_l = (1 − r)·mean_h A_l + r·I, rows normalised, R = Â_L ⋯ Â_1."""
    result = None
    for p in probs:
        a = p.mean(1)
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = (1 - residual) * a + residual * eye
        a = a / a.sum(-1, keepdim=True)
        result = a if result is None else a @ result
    return result


@baseline("rollout", "attention rollout (Abnar & Zuidema 2020): 0.5·A + 0.5·I per block (heads averaged, rows "
          "normalised), multiplied through the blocks; the row of the explained position",
          Option("row", int, 0, "query position read (as for attention)"),
          Option("residual", float, 0.5, "weight of the identity (the residual connection)"))
def attention_rollout(req: Request, row: int, residual: float) -> Explanation:
    probs, out, targets, position = _attention(req)
    r = rollout_matrix(probs, residual)
    rows = _rows(req, row, r.shape[0], r.shape[1])
    scores = torch.stack([r[b, q] for b, q in enumerate(rows)]).cpu()
    return _explanation(req, out, targets, position, {token_input(req.graph): scores})
