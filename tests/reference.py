"""Independent torch references for the transformer-level tests.

:func:`as_exported` makes a Hugging Face module compute in float64 what its ONNX export computes: the
exporters store some constants in float32.

:func:`bert_logits` re-implements a Hugging Face BERT classifier functionally from
its weights, with the implementation trick of Ali et al. 2022 (Sec. 4) as switches:
``detach_probs`` holds the attention probabilities constant (AH rule),
``detach_std`` holds LayerNorm's √(ε+Var) constant (LN rule). Gradient×Input on
the word embeddings of that function is the reference LRP explanation.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F


def _layer_norm(x, module, detach_std: bool):
    mean = x.mean(-1, keepdim=True)
    std = torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + module.eps)
    if detach_std:
        std = std.detach()
    return (x - mean) / std * module.weight + module.bias


def bert_logits(model, words, attention_mask, token_type_ids, *, detach_probs=False, detach_std=False):
    """Logits of ``BertForSequenceClassification`` ``model`` given word embeddings ``words``."""
    bert = model.bert
    emb = bert.embeddings
    length = words.shape[1]
    x = words + emb.position_embeddings.weight[:length] + emb.token_type_embeddings(token_type_ids)
    x = _layer_norm(x, emb.LayerNorm, detach_std)
    blocked = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
    for layer in bert.encoder.layer:
        att = layer.attention.self
        heads, size = att.num_attention_heads, att.attention_head_size

        def split(t):
            return t.view(t.shape[0], length, heads, size).transpose(1, 2)

        q, k, v = split(att.query(x)), split(att.key(x)), split(att.value(x))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size) + blocked, dim=-1)
        if detach_probs:
            probs = probs.detach()
        context = (probs @ v).transpose(1, 2).reshape(x.shape)
        x = _layer_norm(layer.attention.output.dense(context) + x, layer.attention.output.LayerNorm, detach_std)
        hidden = F.gelu(layer.intermediate.dense(x))
        x = _layer_norm(layer.output.dense(hidden) + x, layer.output.LayerNorm, detach_std)
    pooled = torch.tanh(bert.pooler.dense(x[:, 0]))
    return model.classifier(pooled)


def gradient_x_input(fn, leaf: torch.Tensor, target: list[int]) -> torch.Tensor:
    """``leaf ⊙ ∂ Σ_b fn(leaf)[b, target_b] / ∂leaf`` summed over the last dim."""
    leaf = leaf.detach().requires_grad_(True)
    out = fn(leaf)
    out[torch.arange(out.shape[0]), target].sum().backward()
    return (leaf * leaf.grad).sum(-1).detach()


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


class _Gelu(torch.nn.Module):
    """GELU as the exporters decompose it: x · ½ · (1 + erf(x / √2)), √2 rounded to float32."""

    def forward(self, x):
        return x * 0.5 * (1 + torch.erf(x / _f32(math.sqrt(2))))


def as_exported(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of a Hugging Face module with the two constants the exporters store in float32 (the
    attention scale 1/√d and GELU's √2) rounded as in the graph, so that a float64 reference agrees with the
    interpreter to rounding (≈1e-17) instead of to the float32 constants (≈1e-10 in a BERT; ≈1e-8 in a
    Wav2Vec2, whose convolutional front end has GELUs too)."""
    from transformers.activations import GELUActivation
    model = copy.deepcopy(model).double()
    for module in model.modules():
        if isinstance(getattr(module, "scaling", None), float):
            module.scaling = _f32(module.scaling)
        for name, child in list(module.named_children()):
            if isinstance(child, GELUActivation):
                setattr(module, name, _Gelu())
    return model
