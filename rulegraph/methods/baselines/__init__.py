"""The baseline methods, one per file, run through the same interpreter on the exported graph,
in batches. Each is handed the graph as its rule set sees it (``gi`` unless ``@baseline(rules=…)``
names another), canonized (a quantized graph as the float computation it stands for) and bound
once (:class:`~rulegraph.methods.base.Request`). Importing this package registers them in :data:`rulegraph.methods.base.BASELINES`
in this order (the order ``rulegraph methods`` lists them):

* ``random``: seeded random scores (the floor).
* ``gs`` and ``ig`` read ∂f/∂x at the embeddings from the relevance pass with the ``gi``
  rule set (its boundary signal is the gradient); IG runs the interpolated embeddings
  through :meth:`Plan.run` ``overrides``, many steps per batch.
* ``loo`` runs perturbed token sequences through :class:`~rulegraph.methods.sequences.TokenModel`.
* ``mask-lrp-rollout`` and ``mask-lrp-random``: Mask-LRP's rollout of masked attention relevance (Eq. 10–11).
* ``attention`` and ``rollout`` read the attention probabilities: the Softmax outputs
  feeding the attention MatMul, found with the ``ah`` pattern of ``rules/lrp-ah.yaml``;
  ``lat`` traces unit relevance down through them.
* ``gae`` and ``layer-saliency`` read v ⊙ ∂f/∂v at intermediate values (the attention
  probabilities; a block's output, :func:`rulegraph.stream.hidden_states`) from the ``gi`` pass
  (``walk(record_at=...)``).

A new baseline is one file here with ``@baseline(name, description, Option(...), unit=...)``
reading ``req.graph``, ``req.plan`` and ``req.binding`` (never a graph it loads or binds itself),
added to the import list below, and its test in ``tests/methods/``.
"""
from __future__ import annotations

from . import random, gs, ig, loo, attention, rollout, masklrp, lat, gae, layer_saliency  # noqa: F401  (registration order)
from .attention import attention_values
from .rollout import rollout_matrix

__all__ = ["attention_values", "rollout_matrix"]
