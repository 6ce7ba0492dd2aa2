"""``random``: seeded uniform scores, the floor every method should beat."""
from __future__ import annotations

import zlib

import numpy as np
import torch

from ...explanation import Explanation
from ..base import Option, Request, baseline
from ..sequences import token_input
from .common import explanation, forward


@baseline("random", "uniform random scores in [0, 1), seeded by `seed` and the token ids (so a batch "
          "gives the same scores as one-by-one)", Option("seed", int, 0, "random seed"),
          unit="random number in [0, 1)", reference=True)
def random_scores(req: Request, seed: int) -> Explanation:
    key = token_input(req.graph)
    ids = req.inputs[key]
    _, out, targets, position = forward(req, frozenset())
    mask = req.inputs.get("attention_mask")
    rows = []
    for b in range(ids.shape[0]):
        row = ids[b] if mask is None else ids[b][mask[b] != 0]
        digest = zlib.crc32(np.asarray(row.cpu(), dtype=np.int64).tobytes(), seed & 0xFFFFFFFF)
        g = torch.Generator().manual_seed(digest)
        rows.append(torch.rand(ids.shape[1], generator=g, dtype=torch.float64))
    scores = torch.stack(rows)
    return explanation(req, out, targets, position, {key: scores})
