"""What an explanation returns, whatever the pass or method that made it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .audit import Audit

Tensor = torch.Tensor


@dataclass
class Explanation:
    """Relevance of each input position for the explained output scalar(s), plus the audit."""

    output: str                          # name of the explained graph output
    output_tensor: Tensor                # its full value (batch first)
    target: list[int]                    # explained index along the last axis, per batch item
    position: int | list[int] | None     # explained position for sequence outputs (or one per batch item)
    output_value: list[float]            # the explained scalar per batch item
    relevance: dict[str, Tensor]         # boundary key (input name) → per-position scores
    boundary: dict[str, Tensor]          # boundary key → full relevance tensor (e.g. batch × tokens × hidden)
    rules: str
    audit: Audit | None = None
    tokens: list[list[str]] | None = None
    labels: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    recorded: dict[str, Tensor] = field(default_factory=dict)   # relevance at the values asked for (record=…)
    contrast: list[int] | None = None    # subtracted index per batch item (target − contrast explained)
    score: str = "logit"                 # "logit", or "logprob" (see rulegraph.passes.base)

    @property
    def batch_size(self) -> int:
        return len(self.target)

    def scores(self, key: str | None = None, item: int = 0) -> list[float]:
        """Per-position scores of batch item ``item`` for one boundary key (default: the first)."""
        key = key or next(iter(self.relevance))
        return self.relevance[key][item].reshape(-1).tolist()

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "rules": self.rules,
            "output": self.output,
            "target": self.target if self.batch_size > 1 else self.target[0],
            "output_value": self.output_value if self.batch_size > 1 else self.output_value[0],
            "relevance": {k: (v.tolist() if self.batch_size > 1 else v[0].tolist()) for k, v in self.relevance.items()},
        }
        if self.position is not None:
            d["position"] = self.position
        if self.contrast is not None or self.score != "logit":
            d["contrast"] = None if self.contrast is None else \
                self.contrast if self.batch_size > 1 else self.contrast[0]
            d["score"] = self.score
        if self.labels:
            d["labels"] = self.labels
        if self.tokens is not None:
            d["tokens"] = self.tokens if self.batch_size > 1 else self.tokens[0]
        if self.audit is not None:
            d.update(self.audit.to_dict())
        d.update(self.extra)
        for key in ("logprob", "objective_value"):
            if key in self.extra and self.batch_size == 1:
                d[key] = self.extra[key][0]
        return d
