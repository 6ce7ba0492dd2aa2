"""The metadata rulegraph reads from an export (``rulegraph.*`` keys: ONNX ``metadata_props``, a
``.pt2`` archive's ``rulegraph.json``), checked once when the model is loaded, so that a value
that is not what it should be is one error naming the model and the key before any work, never
an error halfway through a run (or a limit silently ignored). Each key has one checker in
:data:`CHECKS`; keys rulegraph does not read are left alone."""
from __future__ import annotations

import json
import math
from typing import Any, Callable

from ..errors import ModelError
from ..ir import Graph

#: the longest sequence an export may declare (rulegraph.max_length)
MAX_LENGTH = 2**24
#: the most class labels an export may declare
MAX_LABELS = 2**20


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _labels(raw: str) -> bool:
    found = _json(raw)
    return isinstance(found, list) and len(found) <= MAX_LABELS and all(isinstance(x, str) for x in found) \
        and len(set(found)) == len(found)


def _count(low: int, high: int) -> Callable[[str], bool]:
    def check(raw: str) -> bool:
        text = raw.strip()
        return text.isdigit() and len(text) < 12 and low <= int(text) <= high
    return check


def _numbers(n: int, positive: bool = False, integers: bool = False) -> Callable[[str], bool]:
    def check(raw: str) -> bool:
        found = _json(raw)
        return isinstance(found, list) and len(found) == n and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (not positive or v > 0)
            and (not integers or (isinstance(v, int) and v <= 2**16)) for v in found)
    return check


def _names(raw: str) -> bool:
    found = _json(raw)
    return isinstance(found, list) and all(isinstance(x, str) and x for x in found)


#: key → (checker of the raw string, what it must be)
CHECKS: dict[str, tuple[Callable[[str], bool], str]] = {
    "rulegraph.labels": (_labels, f"a JSON list of at most {MAX_LABELS:,} distinct class names (strings)"),
    "rulegraph.max_length": (_count(1, MAX_LENGTH), f"an integer in 1…{MAX_LENGTH:,} (the longest input, in tokens)"),
    "rulegraph.decoder_start_token_id": (_count(0, 2**31 - 1), "a token id (an integer ≥ 0)"),
    "rulegraph.image_size": (_numbers(3, positive=True, integers=True), "a JSON list [channels, height, width] of "
                                                                         "positive integers ≤ 65536"),
    "rulegraph.image_mean": (_numbers(3), "a JSON list of 3 finite numbers"),
    "rulegraph.image_std": (_numbers(3, positive=True), "a JSON list of 3 positive numbers"),
    "rulegraph.outputs": (_names, "a JSON list of output names"),
}


def check(graph: Graph) -> Graph:
    """``graph``, once every ``rulegraph.*`` key it records is what it should be (else a :class:`ModelError`)."""
    where = (graph.source or "").partition(":")[2] or graph.source or graph.name or "the model"
    for key, (valid, what) in CHECKS.items():
        raw = graph.metadata.get(key)
        if raw is not None and not valid(str(raw)):
            shown = str(raw) if len(str(raw)) <= 80 else str(raw)[:80] + "…"
            raise ModelError(f"{where}: the export's metadata {key} must be {what}, got {shown!r}")
    return graph
