"""Faithfulness metrics: pure functions of (model call, token ids, scores), one file each.

Importing this package registers them in :data:`METRICS` in the order of the import list
below (the order of the table's columns and of the command line's options). A new metric
is one file here registering a :class:`Metric` subclass with ``@metric(name)`` and its
declarations (``default``, ``higher_is_better``, ``title``, ``x_label``, ``options``),
added to the import list, and its closed-form test in ``tests/evaluate/``.

Conventions, for every metric:

* Only *removable* positions are ever removed: special tokens ([CLS], [SEP], padding)
  stay. ``n`` is their number; a fraction ``f`` of them is ``⌊f·n + ½⌋`` tokens.
* "Most relevant first" orders removable positions by score, highest first; ties by position.
* Removal (:class:`Removal`): ``mask`` replaces a token by [MASK] (by [UNK] when the
  vocabulary has no [MASK]), ``unk`` by [UNK], ``pad`` by [PAD], ``delete`` drops it (the
  sequence shortens), ``zero`` keeps the position with a zero token embedding. AUAC starts from
  [UNK], as in Ali et al. (2022) (``delete``: from nothing; ``zero``: from zero embeddings).
* ``p`` is the softmax probability of the explained class ŷ (the model's prediction on
  the full input, which the method explained); logits are the raw outputs.
* Areas are trapezoids over the fraction axis [0, 1], so they do not grow with length.

The metrics (x̃ᵏ: x with the top-k% removed), each defined in its file:

``aopc``          mean over k ∈ {0, s, …, K}% of p(ŷ|x) − p(ŷ|x̃ᵏ) ↑        (aopc.py)
``lodds``         log p(ŷ|x̃ᵏ) − log p(ŷ|x) at k = 20% ↓                  (lodds.py)
``auac``          area under p(ŷ) revealing from all-[UNK] ↑               (auac.py)
``au-mse``        area under the logits' MSE, least |relevant| first ↓     (au_mse.py)
``hiding``        area under accuracy, hiding most relevant first ↓        (hiding.py)
``revealing``     area under accuracy, revealing most relevant first ↑     (revealing.py)
``word-deletion`` accuracy vs the 1…W most relevant words deleted ↓        (word_deletion.py)
``precision@k``   top-k tokens inside the answer span ↑, off by default   (precision_at_k.py)
``logprob-drop``  mean over k of log p(y|x) − log p(y|x̃ᵏ), y an LM's next token ↑, off by default
                                                                         (logprob_drop.py)
``morf-lerf``     area between the least- and most-relevant-first curves of the protocol's score ↑,
                  off by default (``--protocol achtibat2024``)          (morf_lerf.py)
"""
from __future__ import annotations

from . import aopc as _aopc, lodds as _lodds, auac as _auac, au_mse as _au_mse  # noqa: F401  (registration order)
from . import hiding as _hiding, revealing as _revealing, word_deletion as _word_deletion  # noqa: F401
from . import precision_at_k as _precision_at_k, logprob_drop as _logprob_drop, morf_lerf as _morf_lerf  # noqa: F401
from .aopc import AOPC, Deletion, aopc
from .au_mse import AUMSE, au_mse
from .auac import AUAC, Fractions, auac
from .base import (METRICS, Case, Metric, ModelFn, Option, Removal, Result, all_options, area, build, compute, count,
                   defaults, metric, settings)
from .hiding import Hiding, hiding
from .lodds import LOdds, lodds
from .logprob_drop import LogProbDrop, logprob_drop
from .morf_lerf import MorfLerf, morf_lerf
from .precision_at_k import PrecisionAtK, precision_at_k
from .revealing import Revealing, revealing
from .word_deletion import WordDeletion, word_deletion

__all__ = ["AOPC", "AUAC", "AUMSE", "Case", "Deletion", "Fractions", "Hiding", "LOdds", "LogProbDrop", "METRICS", "Metric",
           "ModelFn", "MorfLerf", "Option", "PrecisionAtK", "Removal", "Result", "Revealing", "WordDeletion", "all_options",
           "aopc", "area", "au_mse", "auac", "build", "compute", "count", "defaults", "hiding", "lodds", "logprob_drop", "metric", "morf_lerf",
           "precision_at_k", "revealing", "settings", "word_deletion"]
