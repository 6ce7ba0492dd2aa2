"""Canonizers: rewrite a graph into an equivalent one the rules treat as intended.

One file per canonizer, each registering itself with ``@canonizer(name)`` (:mod:`.base`):

``quantization``  a quantized graph → the float computation it stands for; applied by default
``batchnorm``     a BatchNormalization merged into the Conv / Gemm feeding it (Zennit's canonizers)
``final-softmax`` a final Softmax / LogSoftmax output replaced by its logits (the prologue applies it to the explained output)

and, applied by the prologue alone (no rule file names it), ``rows.py``: a causal language model's head
computed only at the positions an explanation reads.

A rule file lists the canonizers it wants in ``canonize:`` and turns a default one off with
``no_canonize:`` (docs/rule-files.md).
"""
from . import quantization, batchnorm, final_softmax  # noqa: F401  (register on import; the default first)
from .base import CANONIZERS, Canonizer, canonize, canonizer, defaults
from .batchnorm import fold_batchnorm
from .quantization import dequantize

__all__ = ["CANONIZERS", "Canonizer", "canonize", "canonizer", "defaults", "dequantize", "fold_batchnorm"]
