"""Token sequences and how tokens are removed from them, without torch: the tokenizer's special
ids (:class:`Vocab`), one model input as ids (:class:`Tokens`), the removal modes and the
runtimes that run perturbed forwards. Kept light so that the command line's option declarations
(``rulegraph evaluate --help``) and the metrics' declarations import without torch;
:mod:`rulegraph.methods.sequences` runs the sequences.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .errors import InputError

#: How removed tokens are treated: replaced by [MASK] (or [UNK] when the vocabulary has no
#: [MASK]), replaced by [UNK], replaced by [PAD], deleted from the sequence, or kept in place with
#: their token embedding set to zero (``zero``: the AttnLRP paper's ablation, Achtibat et al.,
#: ICML 2024; the position stays, the id becomes :data:`ZERO`, which the model runner turns into
#: a zero row of the token-embedding lookup).
REMOVALS = ("mask", "unk", "pad", "delete", "zero")

#: The id a ``zero`` removal writes: not a vocabulary entry (ids are ≥ 0) but a marker read by
#: :class:`rulegraph.methods.sequences.TokenModel`, which feeds the model a zero embedding there.
ZERO = -1

#: What runs batched forwards of perturbed sequences: the rulegraph interpreter, or
#: onnxruntime on the model's ONNX file (no relevance is needed there, only logits); ``auto``
#: takes onnxruntime for an ONNX file on the CPU in float32, the interpreter otherwise.
RUNTIMES = ("auto", "rulegraph", "onnxruntime")


@dataclass(frozen=True)
class Vocab:
    """The ids of the tokenizer's padding, unknown and mask tokens (``None``: absent)."""

    pad: int | None = None
    unk: int | None = None
    mask: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer) -> "Vocab":
        """From a ``tokenizers.Tokenizer``: [PAD]/<pad>, [UNK]/<unk>, [MASK]/<mask>."""
        def find(*names: str) -> int | None:
            return next((i for i in (tokenizer.token_to_id(n) for n in names) if i is not None), None)
        return cls(pad=find("[PAD]", "<pad>"), unk=find("[UNK]", "<unk>"), mask=find("[MASK]", "<mask>"))

    def replacement(self, mode: str) -> int | None:
        """The id written in place of a removed token under removal ``mode`` (``None`` for delete)."""
        if mode not in REMOVALS:
            raise InputError(f"unknown removal {mode!r}; valid: {', '.join(REMOVALS)}")
        if mode == "delete":
            return None
        if mode == "zero":
            return ZERO
        if mode == "pad":
            if self.pad is None:
                raise InputError("removal 'pad' needs a [PAD] token, and the tokenizer has none; "
                                 "use --removal mask, unk or delete")
            return self.pad
        token = self.mask if mode == "mask" and self.mask is not None else self.unk
        if token is None:
            raise InputError(f"removal {mode!r} needs an [UNK]{' or [MASK]' if mode == 'mask' else ''} token, and "
                             "the tokenizer has none; use --removal delete")
        return token


@dataclass(frozen=True)
class Tokens:
    """One model input as token ids (and token type ids where the model takes them); hashable,
    so identical perturbations are run once."""

    ids: tuple[int, ...]
    types: tuple[int, ...] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def remove(self, positions: Iterable[int], replacement: int | None) -> "Tokens":
        """These positions replaced by ``replacement`` (:data:`ZERO`: a zero embedding), or deleted when it
        is ``None``."""
        gone = set(positions)
        if not gone:
            return self
        if replacement is None:
            keep = [i for i in range(len(self.ids)) if i not in gone]
            return Tokens(tuple(self.ids[i] for i in keep),
                          None if self.types is None else tuple(self.types[i] for i in keep))
        return Tokens(tuple(replacement if i in gone else t for i, t in enumerate(self.ids)), self.types)
