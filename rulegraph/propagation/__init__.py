"""Rules: how one node hands relevance (or components) from its outputs to its inputs.

Every rule derives from :class:`~rulegraph.propagation.base.Rule` and is registered by name in
its pass's registry (:data:`~rulegraph.propagation.base.RULES`); its dataclass fields are the
``params`` a rule file may set. By family:

``gradient``    Gradient×Input, LRP-0 / ε, the AH and LN rules (Ali et al. 2022)
``modified``    modified-weight rules on linear layers: γ, αβ, z⁺, flat, w², zB
``attnlrp``     the softmax and uniform rules of AttnLRP (Achtibat et al. 2024)
``routing``     ``pass`` (routing ops), ``identity``, ``stop``
``masked``      Mask-LRP's head mask on the AH rule (Song et al. 2024)
``components``  the decomposition pass's rules (Yang et al. 2023)
``quantized``   a quantized graph's quantize–dequantize round trip, the rounding absorbed
``recurrent``   LSTM, GRU and RNN cells walked back in time: gates as weights (Arras et al. 2017)

Adding a rule is one file (or one class in its family's file) plus its closed-form test.
"""
from . import attnlrp, components, gradient, masked, modified, quantized, recurrent, routing  # noqa: F401  (register on import)
from .base import RULES, Rule, decomposition_rule, relevance_rule

__all__ = ["RULES", "Rule", "decomposition_rule", "relevance_rule"]
