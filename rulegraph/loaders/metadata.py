"""The metadata rulegraph writes into an export and reads back (``rulegraph.*`` keys: ONNX
``metadata_props``, a ``.pt2`` archive's ``rulegraph.json``), declared once: :data:`KEYS` gives each
key its :class:`ExportInfo` field, how it is written and what it must be. ``rulegraph export`` writes
the keys from an :class:`ExportInfo` (:meth:`ExportInfo.metadata`); everything that reads one reads
:func:`export_info`, parsed and checked once per graph (when the model is loaded: :func:`check`), so
that a value that is not what it should be is one error naming the model and the key before any
work, never an error halfway through a run (or a limit silently ignored). Keys rulegraph does not
declare are left alone."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ModelError
from ..ir import Graph

#: the longest sequence an export may declare (rulegraph.max_length)
MAX_LENGTH = 2**24
#: the most class labels an export may declare
MAX_LABELS = 2**20
#: the largest token id an export may declare
MAX_TOKEN = 2**31 - 1
#: the highest sampling rate (Hz) an audio export may declare
MAX_SAMPLING_RATE = 10**6
#: the exported tasks that are causal language models, ``[batch, positions, vocab]`` read at a position: a
#: decoder-only LM, and a vision–language model (an LM whose ids hold a picture's image tokens)
CAUSAL_TASKS = ("causal-lm", "image-text-to-text")


@dataclass(frozen=True)
class ExportInfo:
    """What an export records about its model (each field is the key ``rulegraph.<field>``; ``None``:
    not recorded).

    Attributes:
        model_type: the Hugging Face ``config.model_type`` (``"bert"``, ``"gpt2"``…).
        source: the model directory it was exported from.
        task: the head exported (``sequence-classification``, ``causal-lm``…; :data:`CAUSAL_TASKS` are language
            models read at their last position).
        labels: class names in logit order.
        max_length: the longest input, in tokens.
        image_size: ``(channels, height, width)`` of an image model's input.
        image_mean, image_std: the normalisation of its image processor.
        sampling_rate: the samples per second an audio model's waveform input is taken at.
        normalize_audio: whether its feature extractor normalises a clip to zero mean and unit variance.
        decoder_start_token_id: an encoder–decoder's decoder start token.
        eos_token_id: the end-of-sequence token.
        image_token_id: a vision–language model's image token (its ids hold it where a picture goes).
        image_tokens: how many image tokens one picture takes.
        exporter: the exporter that wrote it.
        outputs: the graph's output names.
        export_check: what its export check found.
    """

    model_type: str | None = None
    source: str | None = None
    task: str | None = None
    labels: tuple[str, ...] | None = None
    max_length: int | None = None
    image_size: tuple[int, int, int] | None = None
    image_mean: tuple[float, ...] | None = None
    image_std: tuple[float, ...] | None = None
    sampling_rate: int | None = None
    normalize_audio: bool | None = None
    decoder_start_token_id: int | None = None
    eos_token_id: int | None = None
    image_token_id: int | None = None
    image_tokens: int | None = None
    exporter: str | None = None
    outputs: tuple[str, ...] | None = None
    export_check: str | None = None

    def metadata(self) -> dict[str, str]:
        """The ``rulegraph.*`` entries recording this (the fields that are set, in declaration order)."""
        return {key.name: key.write(getattr(self, key.field)) for key in KEYS
                if getattr(self, key.field) is not None}


@dataclass(frozen=True)
class Key:
    """One metadata key: the :class:`ExportInfo` field it holds, how a value is written and read back
    (``read`` returns ``None`` for a raw string that is not what it must be) and what it must be."""

    field: str
    read: Callable[[str], Any]
    write: Callable[[Any], str]
    what: str

    @property
    def name(self) -> str:
        return f"rulegraph.{self.field}"


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _text(raw: str) -> str:
    return raw


def _labels(raw: str) -> tuple[str, ...] | None:
    found = _json(raw)
    ok = isinstance(found, list) and len(found) <= MAX_LABELS and all(isinstance(x, str) for x in found) \
        and len(set(found)) == len(found)
    return tuple(found) if ok else None


def _count(low: int, high: int) -> Callable[[str], int | None]:
    def read(raw: str) -> int | None:
        text = raw.strip()
        return int(text) if text.isdigit() and len(text) < 12 and low <= int(text) <= high else None
    return read


def _numbers(n: int, positive: bool = False, integers: bool = False) -> Callable[[str], tuple | None]:
    def read(raw: str) -> tuple | None:
        found = _json(raw)
        ok = isinstance(found, list) and len(found) == n and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (not positive or v > 0)
            and (not integers or (isinstance(v, int) and v <= 2**16)) for v in found)
        return tuple(found) if ok else None
    return read


def _flag(raw: str) -> bool | None:
    return {"true": True, "false": False}.get(raw.strip())


def _written_flag(value: bool) -> str:
    return "true" if value else "false"


def _names(raw: str) -> tuple[str, ...] | None:
    found = _json(raw)
    return tuple(found) if isinstance(found, list) and all(isinstance(x, str) and x for x in found) else None


def _integer(value: int) -> str:
    return str(value)


def _list(value: Any) -> str:
    return json.dumps(list(value))


#: every ``rulegraph.*`` key rulegraph writes or reads, in the order an export writes them
KEYS: tuple[Key, ...] = (
    Key("model_type", _text, str, "the model type"),
    Key("source", _text, str, "the model directory"),
    Key("task", _text, str, "the task exported"),
    Key("labels", _labels, _list, f"a JSON list of at most {MAX_LABELS:,} distinct class names (strings)"),
    Key("max_length", _count(1, MAX_LENGTH), _integer,
        f"an integer in 1…{MAX_LENGTH:,} (the longest input, in tokens)"),
    Key("image_size", _numbers(3, positive=True, integers=True), _list,
        "a JSON list [channels, height, width] of positive integers ≤ 65536"),
    Key("image_mean", _numbers(3), _list, "a JSON list of 3 finite numbers"),
    Key("image_std", _numbers(3, positive=True), _list, "a JSON list of 3 positive numbers"),
    Key("sampling_rate", _count(1, MAX_SAMPLING_RATE), _integer,
        f"an integer in 1…{MAX_SAMPLING_RATE:,} (samples per second)"),
    Key("normalize_audio", _flag, _written_flag, "true or false"),
    Key("decoder_start_token_id", _count(0, MAX_TOKEN), _integer, "a token id (an integer ≥ 0)"),
    Key("eos_token_id", _count(0, MAX_TOKEN), _integer, "a token id (an integer ≥ 0)"),
    Key("image_token_id", _count(0, MAX_TOKEN), _integer, "a token id (an integer ≥ 0)"),
    Key("image_tokens", _count(1, MAX_LENGTH), _integer, f"an integer in 1…{MAX_LENGTH:,} (tokens per picture)"),
    Key("exporter", _text, str, "the exporter's name"),
    Key("outputs", _names, _list, "a JSON list of output names"),
    Key("export_check", _text, str, "the export check's summary"),
)
#: :class:`ExportInfo` field (``labels``) → its :class:`Key` (``rulegraph.labels``)
KEY: dict[str, Key] = {key.field: key for key in KEYS}


def parse(metadata: dict[str, str], where: str = "the model") -> ExportInfo:
    """The :class:`ExportInfo` of an export's metadata (a :class:`ModelError` naming ``where`` and the
    key for a value that is not what it must be)."""
    found = {}
    for key in KEYS:
        raw = metadata.get(key.name)
        if raw is None:
            continue
        value = key.read(str(raw))
        if value is None:
            shown = str(raw) if len(str(raw)) <= 80 else str(raw)[:80] + "…"
            raise ModelError(f"{where}: the export's metadata {key.name} must be {key.what}, got {shown!r}")
        found[key.field] = value
    return ExportInfo(**found)


def export_info(graph: Graph) -> ExportInfo:
    """The graph's :class:`ExportInfo`, parsed once (``graph.cache.info``; again only if its ``rulegraph.*``
    entries were changed since)."""
    raw = tuple(graph.metadata.get(key.name) for key in KEYS)
    if graph.cache.info is None or graph.cache.info[0] != raw:
        where = (graph.source or "").partition(":")[2] or graph.source or graph.name or "the model"
        graph.cache.info = (raw, parse(graph.metadata, where))
    return graph.cache.info[1]


def check(graph: Graph) -> Graph:
    """``graph``, once every ``rulegraph.*`` key it records is what it should be (else a :class:`ModelError`)."""
    export_info(graph)
    return graph


def labels(graph: Graph) -> list[str] | None:
    """The class labels the export recorded (``rulegraph.labels``), if any."""
    found = export_info(graph).labels
    return None if found is None else list(found)
