"""``loo``: leave-one-out occlusion, the perturbed sequences batched through
:class:`~rulegraph.methods.sequences.TokenModel`."""
from __future__ import annotations

import torch

from ...errors import InputError
from ...explanation import Explanation
from ..base import Option, Request, baseline
from ..sequences import RUNTIMES, REMOVALS, ZERO, TokenModel, Tokens, token_input
from .common import BATCH_TOKENS, explanation, forward, never_perturbed


@baseline("loo", "leave-one-out occlusion: f(x) − f(x without token i) for each non-special token, the "
          "perturbed sequences batched; for a causal LM, the tokens up to the explained position",
          Option("mode", str, "mask", "how the token is removed: replaced by [MASK] (or [UNK] without one), "
                 "by [UNK] or [PAD], deleted, or its token embedding set to zero", REMOVALS),
          Option("drop", str, "logit", "the drop measured: of the explained logit, or of its softmax probability",
                 ("logit", "prob")),
          Option("runtime", str, "auto", "what runs the perturbed forwards: auto (onnxruntime for an ONNX file "
                 "on the CPU in float32, else the interpreter), rulegraph, onnxruntime", RUNTIMES),
          unit=lambda options: "logit drop" if options["drop"] == "logit" else "probability drop")
def leave_one_out(req: Request, mode: str, drop: str, runtime: str) -> Explanation:
    if mode not in ("delete", "zero") and req.vocab is None:
        raise InputError(f"loo mode {mode!r} needs the tokenizer's [MASK]/[UNK] ids; explain text with a tokenizer "
                         "or use -o loo.mode=delete")
    replacement = None if mode == "delete" else ZERO if mode == "zero" else req.vocab.replacement(mode)
    key = token_input(req.graph)
    ids = req.inputs[key]
    _, out, targets, position = forward(req, frozenset())
    if out.dim() not in (2, 3):
        raise InputError(f"loo needs a [batch, classes] or a causal LM's [batch, positions, vocabulary] output, "
                         f"got shape {tuple(out.shape)}")
    # a causal LM: the logits at the explained position p depend on tokens 0…p only, so each sequence
    # ends there (the runner reads the next-token logits after its last token); later tokens score 0
    ends = [None] * ids.shape[0] if out.dim() == 2 else \
        [p + 1 for p in (position if isinstance(position, list) else [position] * ids.shape[0])]
    fixed = never_perturbed(req, ids)
    mask = req.inputs.get("attention_mask")
    types = req.inputs.get("token_type_ids")
    model = TokenModel(req.graph, output=req.output, device=req.device, dtype=req.dtype,
                       pad_id=req.vocab.pad if req.vocab else 0, batch_tokens=BATCH_TOKENS, runtime=runtime,
                       zeroed=mode == "zero")
    seqs, where = [], []
    for b in range(ids.shape[0]):
        n = int(mask[b].sum()) if mask is not None else ids.shape[1]
        n = n if ends[b] is None else min(n, ends[b])
        tokens = Tokens(tuple(ids[b, :n].tolist()), tuple(types[b, :n].tolist()) if types is not None else None)
        seqs.append(tokens)
        where.append((b, None))
        for i in range(n):
            if not fixed[b, i]:
                seqs.append(tokens.remove([i], replacement))
                where.append((b, i))
    logits = model(seqs)
    value = logits if drop == "logit" else logits.softmax(-1)
    scores = torch.zeros(ids.shape, dtype=torch.float64)
    reference = {}
    for (b, i), row in zip(where, value):
        if i is None:
            reference[b] = row[targets[b]]
        else:
            scores[b, i] = reference[b] - row[targets[b]]
    return explanation(req, out, targets, position, {key: scores}, mode=mode, drop=drop)
