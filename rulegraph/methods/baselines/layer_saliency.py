"""``layer-saliency``: decoded layer saliency (Hou & Castanon 2023, "Decoding Layer Saliency in
Language Transformers", ICML, Alg. 1 with Grad-CAM scores, Eqs. 1 and 5).

At the output h_l [tokens, K] of block l (:func:`rulegraph.stream.hidden_states`: h_0 is what the
embeddings hand to the first block, h_l the residual stream after block l):

1. α_l = ReLU(Σ_k ∂y/∂h_l^k · h_l^k) per position (Eq. 1), y the explained logit (the paper's
   ŷ is the predicted class's, the default target here); ∂y/∂h_l ⊙ h_l, with the total
   derivative, is the ``gi`` relevance pass's relevance at h_l (:func:`~.common.gradient_times_value`);
2. P̂_l = softmax(f^lm(h_l)) [tokens, vocab] (Eq. 3): f^lm the LM head given as an ONNX model
   (``head``: one float input [batch, tokens, K], logits [batch, tokens, vocab] out), else the
   tied decoder h_l·Eᵀ with E the word-embedding table (the ``Gather`` of the token ids), without
   the MLM head's transform and bias, which an exported classifier does not contain;
3. D̂_l: the columns of P̂_l of the T distinct input tokens (a T × n matrix);
4. ŝ^i = Σ_j [D̂^{ij} among the top τ of column D̂^j] · D̂^{ij} α^j (Alg. 1, lines 6–12; Eq. 5
   when τ ≥ T). Line 9 of Alg. 1 writes the sum into ŝ^j; the text around it (ŝ is indexed by
   the tokens, "restrict each ŝ^i … where the input token t_i is a top ranked contributor")
   and Eq. 5 index it by the token i, which is what is done here.

Every position holding token i gets ŝ^i (repeated tokens share one score); padding gets 0.
``layer``: the paper counts h_0 (embeddings) to h_L; its best layers were the middle ones
(5–8 of 12 on SST-2, 6, 8, 9 on AG News, "the middle layers" of Rogers et al. 2020), so by
default l = ⌊L/2⌋ (6 of 12). ``top_tau``: unset keeps every token (Eq. 5); the paper gives no value.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ...errors import InputError
from ...explanation import Explanation
from ...interpreter import prepare
from ...boundary import lookups
from ...stream import hidden_states
from ..base import Option, Request, baseline
from ..sequences import token_input
from .common import explanation, gradient_times_value

Tensor = torch.Tensor


def decoded_saliency(alpha: Tensor, probs: Tensor, ids: Tensor, real: Tensor, tau: int | None) -> Tensor:
    """ŝ per position of one item: ``alpha`` [n], ``probs`` P̂_l [n, vocab], ``ids`` [n], ``real`` [n] bool."""
    idx = real.nonzero().flatten()
    tokens, which = torch.unique(ids[idx], return_inverse=True)
    d = probs[idx][:, tokens].T                                   # D̂_l: [T, n] (rows: tokens, columns: positions)
    if tau is not None and tau < d.shape[0]:
        top = d.topk(tau, dim=0).indices
        d = d * torch.zeros_like(d, dtype=torch.bool).scatter_(0, top, True)
    s = d @ alpha[idx]                                            # ŝ^i = Σ_j D̂^{ij} α^j
    scores = torch.zeros_like(alpha)
    scores[idx] = s[which]
    return scores


def _decode(req: Request, h: Tensor, head: str | None) -> tuple[Tensor, str]:
    if head is not None:
        from ...loaders import load
        path = Path(head)
        if not path.exists():
            raise InputError(f"LM head model not found: {path}")
        graph = load(path)
        floats = [i.name for i in graph.inputs if i.is_float]
        if len(floats) != 1 or len(graph.inputs) != 1:
            raise InputError(f"the LM head {path} must have one float input (the hidden states); it has "
                             f"{[i.name for i in graph.inputs]}")
        plan = prepare(graph, req.device, req.dtype)
        with torch.no_grad():
            env = plan.run({floats[0]: h.to(req.dtype)}, keep=frozenset())
        logits = env[graph.outputs[0]]
        if logits.shape[:-1] != h.shape[:-1]:
            raise InputError(f"the LM head {path} gives shape {tuple(logits.shape)} for hidden states of shape "
                             f"{tuple(h.shape)}; expected [batch, tokens, vocab]")
        return logits, f"LM head {path}"
    key = token_input(req.graph)
    gathers = [lk.node for lk in lookups(req.graph) if lk.source == key]
    if not gathers:
        raise InputError("no word-embedding table to decode with (no Gather of the token ids); give an LM head")
    table = max((n.inputs[0] for n in gathers), key=lambda t: req.graph.constants[t].shape[0])
    e = req.graph.constants[table].to(h.device, h.dtype)
    if e.shape[-1] != h.shape[-1]:
        raise InputError(f"the word embeddings ({tuple(e.shape)}) do not match the hidden size {h.shape[-1]}; "
                         "give an LM head")
    return h @ e.T, f"tied word embeddings {table}"


@baseline("layer-saliency", "decoded layer saliency (Hou & Castanon 2023, Alg. 1): Grad-CAM α = ReLU(Σ_k ∂y/∂h·h) "
          "at the output of block `layer`, weighted by the decoded token probabilities of the input tokens "
          "(LM head `head`, else the tied word embeddings), top-τ per position",
          Option("layer", int, None, "hidden state h_l read: 0 = embeddings output, l = output of block l "
                 "(1-based); negative counts from the last; unset: the middle, ⌊L/2⌋"),
          Option("top_tau", int, None, "keep per position only the τ input tokens it decodes to most likely "
                 "(Alg. 1 line 8); unset: all"),
          Option("head", str, None, "ONNX LM head mapping hidden states to vocabulary logits; unset: the tied "
                 "word-embedding matrix"),
          unit="decoded Grad-CAM saliency")
def layer_saliency(req: Request, layer: int | None, top_tau: int | None, head: str | None) -> Explanation:
    states = hidden_states(req.graph)
    count = len(states) - 1
    if layer is None:
        layer = count // 2
    if not -count - 1 <= layer <= count:
        raise InputError(f"layer {layer} does not exist; h_0 … h_{count} (0 = embeddings, {count} = last block)")
    layer %= count + 1
    if top_tau is not None and top_tau < 1:
        raise InputError("option layer-saliency.top_tau must be at least 1")
    value = states[layer]
    weighted, env, out, targets, position = gradient_times_value(req, [value])
    h = env[value].to(torch.float64)
    if h.dim() != 3:
        raise InputError(f"hidden states {value!r} of shape {tuple(h.shape)}; expected [batch, tokens, hidden]")
    alpha = weighted[value].to(torch.float64).sum(-1).clamp(min=0)
    logits, decoder = _decode(req, h, head)
    probs = logits.to(torch.float64).softmax(-1)
    key = token_input(req.graph)
    ids = req.inputs[key].to(h.device)
    if h.shape[1] != ids.shape[1]:
        raise InputError(f"layer-saliency decodes the hidden states of the token input's own positions; {value!r} has "
                         f"{h.shape[1]} positions and {key} {ids.shape[1]} tokens (an encoder–decoder's decoder "
                         "states): explain it with a rule set (attnlrp) or with ig, gi or attention")
    mask = req.inputs.get("attention_mask")
    real = (mask != 0).to(h.device) if mask is not None else torch.ones_like(ids, dtype=torch.bool)
    scores = torch.stack([decoded_saliency(alpha[b], probs[b], ids[b], real[b], top_tau) for b in range(h.shape[0])])
    return explanation(req, out, targets, position, {key: scores.cpu()}, layer=layer, hidden_state=value,
                       decoder=decoder, alpha=alpha.cpu().tolist())
