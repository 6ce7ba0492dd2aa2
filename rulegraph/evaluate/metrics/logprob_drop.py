"""Log-probability drop, for language models as for classifiers: the mean over k in the AOPC grid
(0…K % in steps, or a protocol's grid) of log p(y|x) − log p(y|x̃ᵏ), x̃ᵏ the context x with its k%
most relevant tokens removed and y the explained token — for a causal LM the next token it
predicts after x (read at x's last position), for a classifier the explained class ŷ. AOPC
(Yang et al. 2023; Song et al. 2024) over log p instead of p: log-probabilities of an LM's next
token are small and spread over orders of magnitude, where differences of p vanish. ↑
Off by default; ``--metrics logprob-drop`` turns it on."""
from __future__ import annotations

from dataclasses import dataclass

from .aopc import Deletion
from .base import Case, ModelFn, Option, Removal, Result, compute, logp, metric


@metric("logprob-drop")
@dataclass
class LogProbDrop(Deletion):
    default = False
    title = "log-probability drop: log p(y|x) − log p(y|x̃ᵏ)"
    x_label = "% of context tokens removed (most relevant first)"
    options = (
        Option("aopc_k", int, 20, "AOPC: mean over k = 0…K % removed", low=0, high=100, attr="k_max"),
        Option("aopc_step", int, 1, "AOPC: k in steps of this many %", low=1, high=100, attr="k_step"),
    )
    protocol = ("grid",)
    k_max: int = 20
    k_step: int = 1
    grid: tuple[float, ...] | None = None       # the protocol's k in %, instead of 0…k_max by k_step

    def __post_init__(self):
        super().__post_init__()
        self.percents = tuple(self.grid) if self.grid is not None else tuple(range(0, self.k_max + 1, self.k_step))

    def reduce(self, case, logits):
        full = logp(logits[case.tokens], case.target)
        drops = [full - logp(logits[self.perturbed(case, k)], case.target) for k in self.percents]
        return Result(sum(drops) / len(drops), drops)


def logprob_drop(model: ModelFn, case: Case, removal: Removal, k_max: int = 20, k_step: int = 1,
                 grid: tuple[float, ...] | None = None) -> Result:
    return compute(LogProbDrop(removal, k_max=k_max, k_step=k_step, grid=grid), model, case)
