"""``explain``: the one public entry, whatever the method, as the command line takes it.

A rule set (a shipped name, a YAML path, a :class:`~rulegraph.RuleSet`) or any method of
``rulegraph methods`` (``ig``, ``loo``…); the model as a file, a loaded graph, a torch.export
program or a Hugging Face module in memory; inputs as tensors, or text (one, or a list: a padded
batch) tokenized with the tokenizer beside the model; targets and contrasts as indices, class
names or token text. The explanation carries the tokens, each token as a reader sees it, and the
names of the explained outputs. Every method runs in :func:`rulegraph.methods.explain_with`, on
the graph as its rule set sees it (a baseline's is ``gi``): rule sets by :func:`rulegraph.passes.apply`.
"""
from __future__ import annotations

import numbers
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from .errors import InputError
from .explanation import Explanation, Targets
from .facts import has_positions, output_kind, roles
from .audio import AudioInput, audio_input, record, waveform_input
from .image import image_input
from .ir import Graph
from .loaders import load
from .loaders.metadata import export_info, labels as model_labels
from .methods import Method, Vocab, explain_with, get
from .methods.sequences import batch
from .objective import Objective, parse as parse_objective
from .passes import prepared
from .passes.base import RUNNER_UP
from .ruleset import RuleSet
from .text import Encoded, TextEncoder, with_image

__all__ = ["Explanation", "encode", "explain", "prepared"]


def explain(model: Any, method: RuleSet | Method | str, inputs: dict[str, Any] | None = None,
            target: int | str | Sequence[int | str] | None = None, *, text: str | Sequence[str] | None = None,
            question: str | None = None, image: Any = None, audio: Any = None, tokenizer: Any = None,
            output: str | None = None,
            position: int | Sequence[int] | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32,
            audit: bool = True, contrast: int | str | Sequence[int | str] | None = None, score: str = "logit",
            objective: str | Objective | None = None, targets: str | Sequence[int | str] | None = None,
            **options: Any) -> Explanation | Targets:
    """Explain ``model``'s output for ``inputs`` (or ``text``) with a rule set or any method.

    ``model``: a :class:`~rulegraph.Graph` or anything :func:`rulegraph.load` takes (a Hugging
    Face module too). ``method``: a rule set (a :class:`~rulegraph.RuleSet`, a shipped name, a
    YAML path) or any method of ``rulegraph methods`` (``"ig"``, ``"loo"``…). ``target``: the
    class index, the class name (its label), or for a language model the text of one token
    (``" Paris"``); one for all items or one per item; default the argmax. ``output``: which graph
    output (default the first). ``position``: for ``[batch, positions, classes]`` outputs, the
    position explained (default each text's last token), or one per batch item. ``contrast``: a
    class (index, name or token text) whose logit is subtracted. ``score``: ``"logit"`` (default) or
    ``"logprob"``: log softmax(z)_target, explained as ``z_target − Σ_j p_j z_j`` with p held
    constant (``e.extra["logprob"]`` has log p_target). ``objective``: a linear expression of the
    explained position's logits and log-probabilities, e.g. ``"logprob[' Paris'] - logprob[' London']"``
    (:mod:`rulegraph.objective`). ``options``: the method's options as keywords, e.g. a
    decomposition's ``groups``, ``alpha``, ``threshold`` (:data:`rulegraph.options.PASS_OPTIONS`) or
    IG's ``steps=16``, as :func:`rulegraph.generate` takes them too.

    A list of texts gives a batch: ``len(e)`` items, ``e[i]`` the i-th as an explanation of its own.

    ``targets``: instead of one ``target``, several — ``"all"`` classes, the ``"top-K"`` of each item,
    or a list (indices, class names or token texts) — explained from **one forward** (a rule set walks
    once per target on the same values; a baseline runs once per target): a :class:`Targets`, one
    explanation per target, each with its own audit.

    Instead of ``inputs``, ``text="…"`` (or a list of texts, explained as one padded batch) is
    tokenized with ``tokenizer`` (a ``tokenizer.json`` path, a ``tokenizers.Tokenizer`` or a
    transformers fast tokenizer; default: the one beside the model file) and fills the model's
    inputs (with one text, ``inputs`` may add what it does not fill); the explanation then carries
    the tokens (``e.tokens``, ``e.texts``). For span QA, ``question="…"`` is encoded before each
    text (the context).

    For a vision model, ``image=`` (a file path, a PIL image, or an array of pixels ``[H, W, C]``)
    is preprocessed as ``rulegraph explain --image`` does it (:func:`rulegraph.image.image_input`: the
    input's layout and sides, the export's recorded size and normalization) and fills the model's
    pixel input; the explanation keeps the pixels, so ``e.plot()`` draws the relevance over the image.

    For an audio model, ``audio=`` (a WAV file's path, or an array of samples at the model's rate) is read,
    resampled and normalised as ``rulegraph explain --audio`` does it (:func:`rulegraph.audio.audio_input`: the
    export's recorded sampling rate and normalisation; an :class:`~rulegraph.audio.AudioInput` it made is taken
    as it is) and fills the model's waveform input, or its log-mel features; ``e.extra["audio"]`` names the
    input and its rate, ``e.clip`` holds what the model took. A speech-to-text model (Whisper) given no
    ``decoder_input_ids`` explains its first token, after the decoder start token the export recorded
    (``rulegraph.generate(…, audio=…)`` explains each token of a transcript).
    """
    method = get(method)           # the Method whatever was given (a name, a path, a RuleSet)
    declared = {o.name for o in method.options}      # a rule set's: those of its pass (a LABEL=METHOD's too)
    if "options" in options and "options" not in declared and isinstance(options["options"], dict):
        given = ", ".join(f"{k}={v!r}" for k, v in options["options"].items())
        raise InputError(f"give {method.name}'s options as keywords ({given}), not options={{…}}")
    if (options.get("replay") or options.get("compiled")) and isinstance(model, (str, os.PathLike)):
        warnings.warn(f"replay: the model given by its path ({model}) is loaded, and its forward and walk traced, "
                      "afresh at every call; load it once (graph = rulegraph.load(path)) and explain the graph",
                      stacklevel=2)
    graph = method.prepared(model)[0]       # the one prologue: loaded, canonized as the method's rule set asks
    picture = None
    pictured = export_info(graph).image_tokens is not None         # a vision–language model: a picture and a text
    if image is not None:
        if text is not None and not pictured:
            raise InputError("give text=… or image=…, not both (only a vision–language model takes both)")
        if isinstance(image, (list, tuple)):
            raise InputError("image= takes one image (a file path, a PIL image or an array of pixels), "
                             f"got a {type(image).__name__}; explain several one by one")
        picture = image_input(graph, image)
        if inputs is not None and not isinstance(inputs, dict):
            raise InputError(f"inputs must be a dict of input name → tensor, got {_kind(inputs)}")
        if picture.name in (inputs or {}):
            raise InputError(f"give inputs[{picture.name!r}] or image=…, not both")
        inputs = {**(inputs or {}), picture.name: picture.tensor}
    sound = None
    if audio is not None:
        if text is not None or image is not None:
            raise InputError("give text=…, image=… or audio=…, one of them")
        sound = audio if isinstance(audio, AudioInput) else \
            audio_input(graph, audio, model if isinstance(model, (str, Path)) else graph.path)
        if inputs is not None and not isinstance(inputs, dict):
            raise InputError(f"inputs must be a dict of input name → tensor, got {_kind(inputs)}")
        if sound.name in (inputs or {}):
            raise InputError(f"give inputs[{sound.name!r}] or audio=…, not both")
        inputs = {**(inputs or {}), sound.name: sound.tensor}
        prefix, start = roles(graph).prefix, export_info(graph).decoder_start_token_id
        if prefix is not None and prefix not in inputs and start is not None:
            inputs[prefix] = torch.tensor([[start]])       # speech to text: its first token
    encoder = None
    listed = [] if targets is None or isinstance(targets, str) else \
        _flat(targets.tolist() if hasattr(targets, "tolist") else targets)              # targets=[" Paris", …]
    needs_words = any(isinstance(x, str) for x in _flat(target) + _flat(contrast) + listed) or isinstance(objective, str)
    if text is not None or tokenizer is not None or needs_words:
        encoder = _encoder(model, graph, tokenizer, required=text is not None or tokenizer is not None)
    encoded: list[Encoded] = []
    special = vocab = None
    if text is not None:
        texts = [text] if isinstance(text, str) else text
        if pictured and isinstance(texts, (list, tuple)) and len(texts) > 1:
            raise InputError(f"a vision–language model explains one text with its picture; got {len(texts)} texts: "
                             "explain them one by one")
        if inputs is not None and not (isinstance(inputs, dict) and len(texts) == 1):
            raise InputError("give inputs or text=…, not both (with one text, inputs may give what the text does "
                             "not fill, e.g. decoder_input_ids)")
        if not isinstance(texts, (list, tuple)) or not texts or not all(isinstance(t, str) for t in texts):
            raise InputError(f"text must be a str or a non-empty list of str, got {_kind(text)}")
        encoded = [encoder.encode(t, question) for t in texts]
        if pictured:
            encoded = [_pictured(graph, e, inputs, image) for e in encoded]
        both = sorted(set(inputs or {}) & set(encoded[0].inputs)) if isinstance(inputs, dict) else []
        if both:
            raise InputError(f"give inputs or text=… for {', '.join(both)}, not both (inputs may add only what the text "
                             "does not fill, e.g. decoder_input_ids)")
        vocab = Vocab.from_tokenizer(encoder.tokenizer)
        if len(encoded) == 1:
            inputs, special = encoder.fill(graph, encoded[0], inputs or {}), torch.tensor([encoded[0].special])
        else:
            inputs, special = batch(graph, encoded, vocab.pad or 0)
            if position is None and len({len(e.tokens) for e in encoded}) > 1 and _has_positions(graph, inputs,
                                                                                                   output):
                position = [len(e.tokens) - 1 for e in encoded]       # each text's last token, not padding
    elif inputs is None:
        raise InputError("give the model's inputs (a dict of input name → tensor), text=…, image=… or audio=…")
    names = model_labels(graph)
    if isinstance(objective, str):
        objective = parse_objective(objective)
    worded = {what: item for what, given in (("target", target), ("contrast", contrast), ("targets", listed))
              for item in _flat(given) if isinstance(item, str) and item not in (names or ()) and item != RUNNER_UP}
    if isinstance(objective, Objective):
        worded.update(("objective token", t) for t in objective.tokens if isinstance(t, str))
    target = _indices(target, "target", names, encoder)
    if listed:
        targets = _indices(listed, "targets", names, encoder)
    contrast = contrast if contrast == RUNNER_UP else _indices(contrast, "contrast", names, encoder)
    if isinstance(objective, Objective) and any(isinstance(t, str) for t in objective.tokens):
        if encoder is None:
            encoder = _encoder(model, graph, tokenizer, required=True)
        objective = objective.resolve(lambda token: encoder.token_id(token, "objective token"))
    if worded:
        _refuse_text_for_indices(graph, output, worded, names)
    if encoded and "word_ids" in declared:
        options = {"word_ids": [e.word_ids for e in encoded], "tokens": [e.tokens for e in encoded], **options}
    result = explain_with(graph, method, inputs, target, output=output, position=position, device=device,
                          dtype=dtype, special=special, vocab=vocab, audit=audit, contrast=contrast, target_score=score,
                          objective=objective, targets=targets, **options)
    several = isinstance(result, list)          # targets=…, or conditions with alternatives (one map each)
    dressed = [_dressed(e, model, graph, inputs, tokenizer, encoder, encoded, names, picture, sound)
               for e in (result if several else [result])]
    return Targets(dressed) if several else dressed[0]


def _pictured(graph: Graph, encoded: Encoded, inputs: Any, image: Any) -> Encoded:
    """A text for a vision–language model: with its picture's image tokens (``rulegraph.image_tokens`` of them)
    after the leading special tokens; refused without a picture."""
    info = export_info(graph)
    pixels = next((i.name for i in graph.inputs if i.is_float), None)
    if image is None and not (isinstance(inputs, dict) and pixels in inputs):
        raise InputError(f"this vision–language model reads a picture with its text: give image=… (or "
                         f"inputs[{pixels!r}])", cli="this vision–language model reads a picture with its text: "
                         "give --image PATH")
    return with_image(encoded, info.image_token_id, info.image_tokens)


def _dressed(e: Explanation, model, graph: Graph, inputs, tokenizer, encoder, encoded: list[Encoded], names,
             picture, sound) -> Explanation:
    """``e`` with what the API knows beyond the method: the tokens and texts, class names, the pixels, a clip's
    rate."""
    e.real = _real(graph, inputs, e.relevance)
    if encoded:
        e.tokens, e.texts, e.special = [x.tokens for x in encoded], [x.texts for x in encoded], [x.special for x in encoded]
        e.word_ids = [x.word_ids for x in encoded]
        e.extra["text"] = encoded[0].text if len(encoded) == 1 else [x.text for x in encoded]
    elif isinstance(inputs, dict) and "input_ids" in inputs:       # ids given: shown as tokens where a tokenizer is known
        encoder = encoder or _encoder(model, graph, tokenizer, required=False)
        ids = torch.as_tensor(inputs["input_ids"])
        if encoder is not None and ids.dim() == 2:
            real = e.real.get("input_ids", torch.ones_like(ids, dtype=torch.bool))
            rows = [[i for i, kept in zip(row, keep) if kept] for row, keep in zip(ids.tolist(), real.tolist())]
            e.tokens = [[encoder.tokenizer.id_to_token(i) or str(i) for i in row] for row in rows]
            e.texts = [encoder.texts(row) for row in rows]
    if e.graph is not None:             # the relevance graph's positions, named as the reader sees them
        e.graph.tokens = e.texts or e.tokens
    if encoder is not None and not names:
        name_tokens(e, encoder)
    images = {k: torch.as_tensor(v).detach().cpu() for k, v in (inputs or {}).items()
              if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() == 4}
    if picture is not None:             # as the image was preprocessed
        e.pixels, e.normalization = images, (picture.mean, picture.std)
    elif images:                        # pixels given as inputs: normalised as the export says
        from .image import preprocessing
        pre = preprocessing(graph.metadata)
        e.pixels, e.normalization = images, (pre["mean"], pre["std"])
    wave_in, rate = waveform_input(graph), export_info(graph).sampling_rate
    clip = sound.extra if sound is not None else record(wave_in.name, rate) if wave_in is not None and rate else None
    given = torch.as_tensor(inputs[clip["input"]]) if clip is not None and clip["input"] in e.boundary else None
    if given is not None and e.boundary[clip["input"]].shape == given.shape:     # per sample or frame: read over time
        e.extra["audio"] = clip
        e.clip = {clip["input"]: given.detach().cpu()}
    return e


def _real(graph: Graph, inputs: Any, relevance: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The positions that hold tokens, by the attention mask given, for the relevance of the token inputs it
    masks (the ids, the token types) where the batch holds padding (``Explanation.real``)."""
    found = roles(graph)
    given = inputs.get(found.mask) if isinstance(inputs, dict) and found.mask is not None else None
    if given is None:
        return {}
    real = torch.as_tensor(given).detach().cpu() != 0
    if real.dim() != 2 or bool(real.all()):
        return {}
    return {k: real for k in (found.ids, found.types) if k in relevance and relevance[k].shape[:2] == real.shape}


def name_tokens(e: Explanation, encoder: TextEncoder) -> None:
    """Name the output indices ``e`` mentions (targets, contrasts, an objective's tokens) by their
    token's text, for a model whose outputs are a vocabulary (a language model)."""
    vocabulary = encoder.tokenizer.get_vocab_size()
    if e.output_tensor.shape[-1] != vocabulary:
        return
    mentioned = [*e.target, *(e.contrast or [])]
    if "objective" in e.extra:
        mentioned += [t.token for t in parse_objective(e.extra["objective"]).terms if isinstance(t.token, int)]
    e.names.update({i: encoder.name(i) for i in mentioned if 0 <= i < vocabulary})


def encode(model: Any, text: str, tokenizer: Any = None, question: str | None = None) -> Encoded:
    """``text`` tokenized for ``model`` (with ``tokenizer``, default the ``tokenizer.json`` beside the
    model file; with a ``question`` for span QA, the pair question, text): ``.inputs`` fills the
    model's inputs, ``.tokens`` and ``.special`` describe them."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {_kind(text)}")
    if question is not None and not isinstance(question, str):
        raise InputError(f"question must be a str, got {_kind(question)}")
    graph = load(model)
    encoder = _encoder(model, graph, tokenizer)
    encoded = encoder.encode(text, question)
    encoded.inputs = encoder.fill(graph, encoded, {})
    return encoded


def _encoder(model: Any, graph: Any, tokenizer: Any, required: bool = True) -> TextEncoder | None:
    """The model's text encoder: ``tokenizer``, else the ``tokenizer.json`` beside the model file
    (``None`` when there is none and it is not ``required``)."""
    path = model if isinstance(model, (str, Path)) else graph.path
    if not required and tokenizer is None and (path is None or TextEncoder.beside(path) is None):
        return None
    if tokenizer is not None or path is None or TextEncoder.beside(path) is None:
        return TextEncoder.for_model(graph, path, tokenizer)
    # the tokenizer.json beside the model, read once per version of the file (reading it took 13 ms, a
    # fifth of an explanation at 94 tokens); the encoder is not handed out, so nothing changes it
    beside = TextEncoder.beside(path)
    stat = beside.stat()
    key = (str(beside.resolve()), stat.st_mtime_ns, stat.st_size, export_info(graph).max_length)
    if key not in _ENCODERS:
        while len(_ENCODERS) >= 8:
            _ENCODERS.pop(next(iter(_ENCODERS)))
        _ENCODERS[key] = TextEncoder.for_model(graph, path, None)
    return _ENCODERS[key]


#: text encoders of the tokenizer.json files beside models, by file version (see :func:`_encoder`)
_ENCODERS: dict[tuple, TextEncoder] = {}


def _indices(given: Any, what: str, names: list[str] | None, encoder: TextEncoder | None) -> Any:
    """``target`` / ``contrast`` as indices: a class name of the model's labels, or the text of one
    token (a language model), becomes its index; indices (Python, numpy or torch integers) stay."""
    if given is None:
        return None
    if isinstance(given, torch.Tensor) and given.dim() <= 1 and not given.is_floating_point():
        given = given.tolist()
    if hasattr(given, "dtype") and hasattr(given, "tolist") and not isinstance(given, torch.Tensor):
        given = given.tolist()              # a numpy integer or array
    items = given if isinstance(given, (list, tuple)) else [given]
    out = []
    for item in items:
        if isinstance(item, numbers.Integral) and not isinstance(item, bool):
            out.append(int(item))
        elif isinstance(item, str) and names:
            if item not in names:
                raise InputError(f"{what} {item!r} is not a class of this model; its classes: {', '.join(names)}")
            out.append(names.index(item))
        elif isinstance(item, str) and encoder is not None:
            out.append(encoder.token_id(item, what))
        elif isinstance(item, str):
            raise InputError(f"{what} {item!r} is text: it needs the model's labels or its tokenizer "
                             "(tokenizer=…, or a tokenizer.json beside the model)")
        else:
            raise InputError(f"{what} must be a class index, a class name or a token's text (or a list of them), "
                             f"got {_kind(item)}")
    return out if isinstance(given, (list, tuple)) else out[0]


def _refuse_text_for_indices(graph: Graph, output: str | None, worded: dict[str, str], names: list[str] | None) -> None:
    """A token's text names a token id: refuse it where the explained output is not indexed by the
    vocabulary (a classifier's classes, a span-QA output's positions), as the output's kind says
    (:func:`rulegraph.facts.output_kind`; nothing is refused when its probe cannot run)."""
    output = output or graph.outputs[0]
    kind = output_kind(graph, output)
    if kind is None or kind.vocabulary_scores:
        return
    what, text = next(iter(worded.items()))
    classes = kind.shape[-1]
    valid = "a position index" if kind.position_scores else f"a class index (0…{classes - 1})"
    valid += f" or a label ({', '.join(names)})" if names else ""
    raise InputError(f"{what} {text!r} is text, but output {output!r} is not indexed by the vocabulary (it scores "
                     f"{'positions' if kind.position_scores else f'{classes} classes'}); give {valid}")


def _flat(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _kind(value: Any) -> str:
    return f"{value!r}" if isinstance(value, (int, float, bool)) or value is None else f"a {type(value).__name__}"


def _has_positions(graph, inputs: dict[str, Any], output: str | None) -> bool:
    """Whether the explained output has a positions axis (:func:`rulegraph.facts.has_positions`: as the export
    states it, else its kind, probed on the first item if not yet known)."""
    return has_positions(graph, output, lambda: {k: v[:1] for k, v in inputs.items()})
