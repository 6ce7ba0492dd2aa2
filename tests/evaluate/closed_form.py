"""The closed-form setting of the metric tests: a linear bag-of-words model (tests/evaluate/bow.py).

With logit difference s = Σ_t w_t and a removed token counting 0, p(positive | x̃) = σ(s − Σ_removed w):
every curve is a sum of known weights through a sigmoid, computed in the tests from the definitions
with numpy, independently of rulegraph.evaluate.metrics.
"""
from __future__ import annotations

import math

import numpy as np
import torch

import bow
from rulegraph.evaluate import metrics as M
from rulegraph.methods import Tokens

W = bow.weights()
UNK, MASK_FREE = 4, None
REMOVAL = M.Removal("unk", UNK, UNK)
IDS = [2, 11, 17, 23, 31, 42, 55, 60, 71, 88, 93, 3]        # [CLS] … [SEP]: 10 removable tokens
SPECIAL = [True] + [False] * 10 + [True]


def model(seqs):
    """logits (−s/2, s/2) with s = Σ w over the sequence (the ONNX bow model, in numpy)."""
    s = torch.tensor([float(W[list(t.ids)].sum()) for t in seqs], dtype=torch.float64)
    return torch.stack([-s / 2, s / 2], 1)


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def case(scores=None, label=None, words=None, answer=None):
    s = float(W[IDS].sum())
    target = int(s > 0)
    sign = 1 if target == 1 else -1     # the exact contribution of a token to the explained logit: ±w/2
    scores = scores if scores is not None else [0.0] + [sign * float(W[i]) / 2 for i in IDS[1:-1]] + [0.0]
    return M.Case(Tokens(tuple(IDS)), SPECIAL, scores, target, label, words, answer)


def p_target(c, removed):
    """p(ŷ | x with these positions removed), closed form."""
    s = float(W[IDS].sum()) - float(sum(W[IDS[i]] for i in removed))
    return sigmoid(s) if c.target == 1 else 1 - sigmoid(s)


def ideal(c):
    """Removable positions, most relevant first, from the weights (ties impossible: distinct w)."""
    sign = 1 if c.target == 1 else -1
    return sorted([i for i in range(len(IDS)) if not SPECIAL[i]], key=lambda i: -sign * W[IDS[i]])


def trapezoid(ys, xs):
    return float(np.trapezoid(ys, xs)) if hasattr(np, "trapezoid") else float(np.trapz(ys, xs))


