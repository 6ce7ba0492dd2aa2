"""Load Hugging Face models and export them to ONNX or torch.fx.

A Hugging Face model directory (as written by ``save_pretrained``) holds
``config.json`` and the weights, and beside them what turns raw input into the model's:
the fast tokenizer (``tokenizer.json``, needed for export) of a text model, the image
processor or feature extractor (``preprocessor_config.json``, optional) of an image or audio classifier.

Which head is exported is a :class:`Head` of :data:`HEADS` — audio classification, sequence classification,
image classification, causal LM, span question answering, encoder–decoder LM — each a wrapper module
with plain named inputs and outputs. The task is the one ``config.architectures`` names (its
endings), else the first whose transformers Auto class knows the config's model type, unless
given. :func:`export_hf` turns the directory into ``model.onnx`` plus copies of the task's
files, with the task, labels (classifiers) and the maximum length (or the image size and
normalisation, or the audio's sampling rate) in the ONNX metadata.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch

from ..audio import made_up_samples
from ..errors import ExportError, InputError
from ..loaders.metadata import MAX_SAMPLING_RATE, ExportInfo
from ..registry import Registry
from ._common import dynamic_axes
from .check import verify
from .external import EXTERNAL_DATA_THRESHOLD
from .moe import use_dense_experts
from .ssm import restore_scan, use_quadratic_scan
from .to_fx import FX_METADATA, export_fx
from .to_onnx import check_exporter_options, export_onnx, refuse_overwrite

#: Attention implementations :func:`load_hf` accepts. ``eager`` gives explicit Softmax and MatMul nodes.
ATTENTIONS = ("eager", "sdpa")
#: Model types whose position ids start after the padding index (RoBERTa style).
PADDING_OFFSET_MODEL_TYPES = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm", "data2vec-text", "longformer", "mpnet"}
)
#: The id range of a model that reads Unicode code points and has no vocabulary (CANINE).
CODE_POINTS = 0x110000
#: ONNX file and tokenizer file names in an export directory.
MODEL_FILE = "model.onnx"
FX_FILE = "model.pt2"
TOKENIZER_FILE = "tokenizer.json"
PREPROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class HFInfo:
    """What an exporter and an explainer need to know about a Hugging Face classifier.

    Attributes:
        model_type: ``config.model_type`` (``"bert"``, ``"gpt2"``, ``"vit"``...).
        labels: class names in logit order, from ``config.id2label``.
        max_length: the longest token sequence the position embeddings allow, or
            ``None`` if the model has no such limit in its config (or takes images).
        input_names: the inputs the model takes: ``input_ids``, ``attention_mask`` and,
            for models with more than one token type (BERT), ``token_type_ids``; or
            ``pixel_values`` for an image classifier.
        vocab_size: the size of the token vocabulary (0 for an image classifier; :data:`CODE_POINTS`
            for a model that reads characters and has no vocabulary, CANINE).
        pad_token_id: the padding token id from the config, or ``None``.
        source: the model directory, resolved.
        task: the :data:`HEADS` entry the model was loaded as.
        outputs: the graph's output names.
        image_size: ``(channels, height, width)`` of an image classifier's input, else ``None``.
        image_mean, image_std: the normalisation of its image processor, when the directory has one.
        sampling_rate: an audio classifier's samples per second (its feature extractor's, else 16 kHz).
        normalize_audio: whether its feature extractor normalises a clip (``do_normalize``, else true).
        features: ``(mel bins, frames)`` of an audio classifier over log-mel features (Whisper's), else ``None``.
        decoder_start: an encoder–decoder's decoder start token (``config.decoder_start_token_id``).
        eos_token_id: the end-of-sequence token of a language model, or of an encoder–decoder classifier
            (whose rows must each end in it), if the config names one.
        encoder_decoder: the model is an encoder–decoder (BART, T5…).
        image_token_id: a vision–language model's image token, which ``input_ids`` hold where the picture goes.
        image_tokens: how many of them one picture takes (its projected features), else ``None``.
    """

    model_type: str
    labels: tuple[str, ...]
    max_length: int | None
    input_names: tuple[str, ...]
    vocab_size: int
    pad_token_id: int | None
    source: str
    task: str = "sequence-classification"
    outputs: tuple[str, ...] = ("logits",)
    image_size: tuple[int, int, int] | None = None
    image_mean: tuple[float, ...] | None = None
    image_std: tuple[float, ...] | None = None
    sampling_rate: int | None = None
    normalize_audio: bool | None = None
    features: tuple[int, int] | None = None
    decoder_start: int | None = None
    eos_token_id: int | None = None
    encoder_decoder: bool = False
    image_token_id: int | None = None
    image_tokens: int | None = None

    def metadata(self) -> dict[str, str]:
        """The ONNX ``metadata_props`` entries describing this model (the keys of
        :data:`rulegraph.loaders.metadata.KEYS`, as :class:`~rulegraph.loaders.metadata.ExportInfo` writes them)."""
        return ExportInfo(model_type=self.model_type, source=self.source, task=self.task,
                          labels=self.labels or None, max_length=self.max_length, image_size=self.image_size,
                          image_mean=self.image_mean, image_std=self.image_std, sampling_rate=self.sampling_rate,
                          normalize_audio=self.normalize_audio,
                          decoder_start_token_id=self.decoder_start, eos_token_id=self.eos_token_id,
                          image_token_id=self.image_token_id, image_tokens=self.image_tokens).metadata()

    @property
    def _eos_rows(self) -> bool:
        """An encoder–decoder classifier reads each row's last eos token (BART, T5)."""
        return self.encoder_decoder and self.task == "sequence-classification" and self.eos_token_id is not None

    def finish(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``inputs`` made ones the model accepts: an encoder–decoder classifier (BART, T5) reads the
        hidden state at each row's last eos token and checks that every row holds as many eos tokens,
        so each row gets one, at the end of its tokens (the export check resizes rows); a vision–language model's
        rows hold exactly one picture's image tokens, after their first token (:func:`place_image`)."""
        if self.image_tokens is not None and "input_ids" in inputs:
            return place_image(inputs, self.image_token_id, self.image_tokens, 1 if self.pad_token_id == 0 else 0)
        if not self._eos_rows or "input_ids" not in inputs:
            return inputs
        ids, mask = inputs["input_ids"].clone(), inputs.get("attention_mask")
        ends = mask.sum(1) - 1 if mask is not None else torch.full((ids.shape[0],), ids.shape[1] - 1)
        first = 1 if self.pad_token_id == 0 else 0
        other = first if first != self.eos_token_id else first + 1
        ids = ids.masked_fill(ids == self.eos_token_id, other)
        ids[torch.arange(ids.shape[0]), ends] = self.eos_token_id
        return {**inputs, "input_ids": ids}

    def example_inputs(self, batch: int = 2, length: int = 8) -> dict[str, torch.Tensor]:
        """Deterministic example inputs for tracing (see the task's ``example``)."""
        if batch < 2:
            raise ValueError("example inputs need batch >= 2 so the batch axis is traced as dynamic")
        return HEADS.get(self.task).example(self, batch, length)


def _token_example(info: HFInfo, batch: int, length: int) -> dict[str, torch.Tensor]:
    """Token ids and a mask whose last row is right-padded; an encoder–decoder classifier's rows each
    end in one eos token (the classification head's check).

    The padding matters: traced code that takes a shortcut for an all-ones mask
    would otherwise bake that shortcut into the export.
    """
    if length < 4:
        raise ValueError("example inputs need batch >= 2 and length >= 4 so padding and dynamic axes are traced")
    first = 1 if info.pad_token_id == 0 else 0
    ids = first + torch.arange(batch * length).reshape(batch, length) % (info.vocab_size - first)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length // 2 + 1 :] = 0
    if info.pad_token_id is not None:
        ids = ids.masked_fill(mask == 0, info.pad_token_id)
    inputs = info.finish({"input_ids": ids, "attention_mask": mask})
    ids = inputs["input_ids"]
    if "token_type_ids" in info.input_names:
        inputs["token_type_ids"] = torch.zeros(batch, length, dtype=torch.long)
    if "decoder_input_ids" in info.input_names:       # a target prefix of another length than the source
        inputs["decoder_input_ids"] = ids[:, : length - 2]
    return inputs


def _image_example(info: HFInfo, batch: int, length: int) -> dict[str, torch.Tensor]:
    """Normalised pixels of the model's image size (``length`` is not used)."""
    g = torch.Generator().manual_seed(0)
    return {"pixel_values": torch.randn(batch, *info.image_size, generator=g)}


def _vision_lm_example(info: HFInfo, batch: int, length: int) -> dict[str, torch.Tensor]:
    """Token ids with one picture's image tokens after the first, ``length`` text tokens around them, the last
    row right-padded after the picture; normalised pixels of the model's image size."""
    inputs = _token_example(info, batch, length + info.image_tokens)
    return {**inputs, **_image_example(info, batch, length)}


def _speech_example(info: HFInfo, batch: int, length: int) -> dict[str, torch.Tensor]:
    """Log-mel features of the model's size (:func:`_audio_example`) and a target prefix of ``length − 2`` token
    ids from the decoder start token."""
    ids = torch.arange(batch * (length - 2)).reshape(batch, length - 2) % info.vocab_size
    ids[:, 0] = info.decoder_start if info.decoder_start is not None else 0
    return {**_audio_example(info, batch, length), "decoder_input_ids": ids}


def place_image(inputs: dict[str, torch.Tensor], image_token_id: int, count: int,
                other: int) -> dict[str, torch.Tensor]:
    """``inputs`` whose ``input_ids`` rows hold ``count`` image tokens at positions 1…count, attended, and no other
    (a stray one becomes ``other``): what a vision–language model with one picture per row accepts."""
    ids = inputs["input_ids"].masked_fill(inputs["input_ids"] == image_token_id, other)
    if ids.shape[1] < count + 2:
        raise ValueError(f"rows of {ids.shape[1]} tokens cannot hold a picture's {count} image tokens and text")
    ids[:, 1:count + 1] = image_token_id
    out = {**inputs, "input_ids": ids}
    if "attention_mask" in inputs:
        mask = inputs["attention_mask"].clone()
        mask[:, :count + 2] = 1
        out["attention_mask"] = mask
    return out


def _audio_example(info: HFInfo, batch: int, length: int) -> dict[str, torch.Tensor]:
    """A normalised waveform of a quarter second at the model's sampling rate
    (:func:`rulegraph.audio.made_up_samples`), or log-mel features of the model's size (``info.features``);
    ``length`` is not used."""
    g = torch.Generator().manual_seed(0)
    if info.features is not None:
        return {"input_features": torch.randn(batch, *info.features, generator=g)}
    return {"input_values": torch.randn(batch, made_up_samples(info.sampling_rate), generator=g)}


class _Wrapper(torch.nn.Module):
    """A loaded Hugging Face model as one head's ``forward`` (the subclasses), in the model's training mode."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.training = model.training


class HFClassifier(_Wrapper):
    """A Hugging Face sequence classifier or causal LM as
    ``forward(input_ids, attention_mask[, token_type_ids]) -> logits``.

    Inputs are passed on by keyword, ``use_cache=False`` is passed when the model
    takes it (GPT-2 style), and only the ``logits`` tensor is returned, so the module
    exports to a graph with plain named inputs and a single output.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self._takes_use_cache = "use_cache" in inspect.signature(model.forward).parameters

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return the logits: ``(batch, num_labels)`` for a classifier, ``(batch, positions, vocab)`` for a causal LM."""
        kwargs: dict[str, object] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        if self._takes_use_cache:
            kwargs["use_cache"] = False
        return self.model(**kwargs).logits


class HFImageClassifier(_Wrapper):
    """A Hugging Face image classifier (ViT...) as ``forward(pixel_values) -> logits``."""

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Return the classification logits, shape ``(batch, num_labels)``."""
        return self.model(pixel_values=pixel_values).logits


class HFAudioClassifier(_Wrapper):
    """A Hugging Face audio classifier as ``forward(input_values | input_features) -> logits``: over the
    waveform ``[batch, samples]`` (Wav2Vec2, HuBERT, WavLM, Data2VecAudio… ``ForSequenceClassification``), or
    over log-mel features ``[batch, mel bins, frames]`` (Whisper's ``…ForAudioClassification``), whichever the
    model's ``main_input_name`` is. A clip is taken whole, with no attention mask."""

    def forward(self, input_values: torch.Tensor | None = None,
                input_features: torch.Tensor | None = None) -> torch.Tensor:
        """Return the classification logits, shape ``(batch, num_labels)``."""
        given = {"input_values": input_values} if input_features is None else {"input_features": input_features}
        return self.model(**given).logits


class HFSeq2SeqLM(_Wrapper):
    """A Hugging Face encoder–decoder LM (BART, T5, Marian…) as
    ``forward(input_ids, attention_mask, decoder_input_ids) -> logits`` ``[batch, target, vocab]``.

    The decoder's ids are a graph input (not shifted from labels inside the model), so the
    exported graph looks up the decoder-side token embeddings from an integer input and the
    relevance boundary reads them like the encoder's; ``use_cache=False``, only the logits.
    """

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Return the next-token logits at every target position, ``(batch, target, vocab)``."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                          use_cache=False).logits


class HFSpeechSeq2Seq(_Wrapper):
    """A Hugging Face speech-to-text encoder–decoder (Whisper) as
    ``forward(input_features, decoder_input_ids) -> logits`` ``[batch, target, vocab]``: the encoder reads a
    clip's log-mel features ``[batch, mel bins, frames]`` (a whole clip, no attention mask), the decoder's ids are
    a graph input as in :class:`HFSeq2SeqLM`; ``use_cache=False``, only the logits. The decoder's mask is given
    (all ones): without one, transformers looks for packed sequences in the positions (``torch.diff``), which the
    TorchScript exporter cannot write."""

    def forward(self, input_features: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Return the next-token logits at every target position, ``(batch, target, vocab)``."""
        return self.model(input_features=input_features, decoder_input_ids=decoder_input_ids,
                          decoder_attention_mask=torch.ones_like(decoder_input_ids), use_cache=False).logits


class HFVisionLM(_Wrapper):
    """A Hugging Face vision–language model (Gemma 3, InternVL…: image patches and text tokens in one sequence) as
    ``forward(input_ids, attention_mask, pixel_values) -> logits`` ``[batch, positions, vocab]``. ``input_ids``
    hold the model's image token where the picture goes, as many as the picture's features
    (:attr:`HFInfo.image_tokens`), and the model writes its projected patch features there; ``use_cache=False``,
    only the logits."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                pixel_values: torch.Tensor) -> torch.Tensor:
        """Return the next-token logits at every position, ``(batch, positions, vocab)``."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, pixel_values=pixel_values,
                          use_cache=False).logits


class HFQuestionAnswering(_Wrapper):
    """A Hugging Face span-QA model (``…ForQuestionAnswering``) as
    ``forward(input_ids, attention_mask[, token_type_ids]) -> (start_logits, end_logits)``,
    each ``(batch, positions)``: the explained "class" of either output is a token position."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        kwargs: dict[str, object] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        out = self.model(**kwargs)
        return out.start_logits, out.end_logits


@dataclass(frozen=True)
class Head:
    """One kind of Hugging Face head: how it is loaded, wrapped, described and fed.

    Attributes:
        auto_class: the transformers Auto class that loads it.
        wrapper: the module exported, taking the named inputs and returning ``outputs``.
        files: files copied beside the export when the directory has them.
        required: those of ``files`` an export cannot do without, with what each is.
        describe: ``(model, model_dir, task name) -> HFInfo``.
        example: ``(info, batch, length) -> example inputs`` for tracing.
        outputs: the graph's output names.
        architectures: endings of ``config.architectures`` names that mark the task.
        labelled: the output's last axis is the config's classes (``id2label``).
        by_auto_class: the architecture's ending marks the task only where :attr:`auto_class` also knows the
            config's model type (an audio classifier's class ends in ``ForSequenceClassification`` too).
    """

    auto_class: str
    wrapper: Callable[[torch.nn.Module], torch.nn.Module]
    files: tuple[str, ...]
    required: Mapping[str, str]
    describe: Callable[[torch.nn.Module, Path, str], HFInfo]
    example: Callable[[HFInfo, int, int], dict[str, torch.Tensor]]
    outputs: tuple[str, ...] = ("logits",)
    architectures: tuple[str, ...] = ()
    labelled: bool = False
    by_auto_class: bool = False

    def knows(self, config: object) -> bool:
        """Whether this head's Auto class loads ``config``'s model type."""
        import transformers
        return type(config) in getattr(transformers, self.auto_class)._model_mapping


#: task name → :class:`Head`, in the order tried; ``rulegraph export --task`` and :func:`load_hf` take these names
HEADS: Registry[Head] = Registry("task", InputError)


def task_of(config: object, architecture: str | None = None) -> str:
    """The task ``architecture`` (a model's class name) or else ``config.architectures`` names (the
    first whose endings match), else the first :data:`HEADS` entry whose Auto class knows
    ``config``'s model type.

    Raises:
        ValueError: none does.
    """
    import transformers

    for architecture in [*([architecture] if architecture else []), *(getattr(config, "architectures", None) or ())]:
        for name in HEADS:
            head = HEADS.get(name)
            if architecture.endswith(head.architectures) and (not head.by_auto_class or head.knows(config)):
                return name
    for name in HEADS:
        if HEADS.get(name).knows(config):
            return name
    kinds = ", ".join(f"{HEADS.get(n).auto_class} ({n})" for n in HEADS)
    raise ValueError(f"model type {getattr(config, 'model_type', '?')!r} has no head rulegraph exports "
                     f"(tried {kinds})")


def load_hf(
    model_dir: str | os.PathLike,
    *,
    attention: str = "eager",
    num_labels: int | None = None,
    task: str | None = None,
) -> tuple[torch.nn.Module, HFInfo]:
    """Load a model from a Hugging Face model directory, in eval mode, wrapped for export by its
    task's wrapper (see :data:`HEADS`).

    Args:
        model_dir: a directory written by ``save_pretrained`` (``config.json`` + weights).
        attention: ``"eager"`` (explicit Softmax/MatMul; the default) or ``"sdpa"``.
        num_labels: override the number of classes; a head of a different size is
            newly initialised by transformers.
        task: a :data:`HEADS` name; default: :func:`task_of` the config.

    Raises:
        FileNotFoundError: the directory or its ``config.json`` is missing.
        ValueError: unknown attention or task, or the model type has no head for the task in transformers.
    """
    import transformers

    model_dir = _check_model_dir(model_dir)
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}; valid: {', '.join(ATTENTIONS)}")
    config, name = _config(model_dir, num_labels, task)
    chosen = HEADS.get(name)
    try:
        with _no_progress_bars():
            model = getattr(transformers, chosen.auto_class).from_pretrained(model_dir, config=config,
                                                                             attn_implementation=attention)
    except ValueError as error:
        if "Unrecognized configuration class" not in str(error):
            raise
        raise ValueError(f"model type {config.model_type!r} in {model_dir} has no {name} head in transformers") from None
    use_dense_experts(model)            # a mixture of experts: every expert on every token (exporters/moe.py)
    use_quadratic_scan(model)           # Mamba: the selective scan at any length (exporters/ssm.py)
    return chosen.wrapper(model).eval(), chosen.describe(model, model_dir, name)


def _config(model_dir: Path, num_labels: int | None = None, task: str | None = None) -> tuple[object, str]:
    """The directory's config and its task name (``task`` when given)."""
    from transformers import AutoConfig

    if task is not None and task not in HEADS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(HEADS)}")
    overrides = {} if num_labels is None else {"num_labels": num_labels}
    config = AutoConfig.from_pretrained(model_dir, **overrides)
    try:
        return config, task or task_of(config)
    except ValueError as error:
        raise ValueError(f"{error}; in {model_dir}") from None


def _companions(model_dir: Path, out_dir: Path, model_path: Path, overwrite: bool,
                task: str | None = None) -> dict[Path, Path]:
    """The files of the directory's task to copy beside an export (source → copy); refuses a
    missing required one, and (without ``overwrite``) an export or copy that would replace a file."""
    task = HEADS.get(_config(model_dir, task=task)[1])
    for name, what in task.required.items():
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"no {name} in {model_dir}; save {what} there")
    copies = {model_dir / name: out_dir / name for name in task.files if (model_dir / name).is_file()}
    for path in (model_path, *copies.values()):
        if os.path.islink(path):
            raise ValueError(f"{path} is a symbolic link; the export never writes through a link (its target would "
                             "be replaced): remove it or choose another OUT_DIR")
    if not overwrite:
        for path in (model_path, *copies.values()):
            refuse_overwrite(path)
    return {source: copy for source, copy in copies.items() if not _same(source, copy)}   # a copy onto itself: kept


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _copy(copies: dict[Path, Path]) -> None:
    """Each companion file copied whole beside the export (a temporary file renamed over the copy)."""
    from ..files import write_file
    for source, copy in copies.items():
        write_file(copy, source.read_bytes(), copy.name)


def export_hf(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    exporter: str = "torchscript",
    attention: str = "eager",
    opset: int = 18,
    overwrite: bool = False,
    metadata: Mapping[str, str] | None = None,
    task: str | None = None,
    external_data: int = EXTERNAL_DATA_THRESHOLD,
) -> Path:
    """Export a Hugging Face model to ``out_dir/model.onnx`` next to copies of its task's files
    (a text classifier's ``tokenizer.json``, an image classifier's ``preprocessor_config.json``).

    The ONNX file has inputs named as in :attr:`HFInfo.input_names` with a dynamic
    ``batch`` axis (and ``sequence`` for token inputs, ``decoder_sequence`` for a decoder's),
    the outputs of the ``task`` (:data:`HEADS`: ``logits``, or ``start_logits`` and ``end_logits``
    for span QA), and metadata
    ``rulegraph.labels`` (JSON list), ``rulegraph.model_type``, ``rulegraph.source``,
    ``rulegraph.task``, ``rulegraph.exporter`` and ``rulegraph.max_length`` (text; an encoder–decoder
    classifier also ``rulegraph.eos_token_id``, which ends every row) or
    ``rulegraph.image_size`` / ``image_mean`` / ``image_std`` (images); entries in
    ``metadata`` are added and take precedence. Weights above ``external_data`` bytes (and always
    over 2 GiB) go to ``model.onnx.data`` beside it (see :func:`~rulegraph.exporters.export_onnx`).

    Returns:
        the path of ``model.onnx``.

    Raises:
        FileNotFoundError: the directory, its ``config.json`` or (text) its ``tokenizer.json`` is missing.
        FileExistsError: ``out_dir`` already holds ``model.onnx`` or a file to copy and ``overwrite`` is false.
        ValueError: unknown exporter or attention, an opset below 17, or a model with no classification head.
    """
    model_dir = _check_model_dir(model_dir)
    check_exporter_options(exporter, opset)
    out_dir = Path(out_dir)
    model_path = out_dir / MODEL_FILE
    copies = _companions(model_dir, out_dir, model_path, overwrite, task)
    module, info = load_hf(model_dir, attention=attention, task=task)
    export_onnx(
        module,
        info.example_inputs(),
        model_path,
        exporter=exporter,
        opset=opset,
        output_names=info.outputs,
        metadata={**info.metadata(), **(metadata or {})},
        overwrite=overwrite,
        external_data=external_data,
        finish=info.finish,
    )
    _copy(copies)
    return model_path


def export_hf_fx(
    model_dir: str | os.PathLike,
    *,
    attention: str = "eager",
    dynamic: bool = True,
    task: str | None = None,
) -> tuple[torch.export.ExportedProgram, HFInfo]:
    """Capture a Hugging Face classifier as a :class:`torch.export.ExportedProgram`.

    The program takes the keyword inputs named in :attr:`HFInfo.input_names`
    (``program.module()(**inputs)``) and returns the logits.

    Raises:
        FileNotFoundError: the directory or its ``config.json`` is missing.
        ValueError: unknown attention.
    """
    module, info = load_hf(model_dir, attention=attention, task=task)
    return export_fx(module, info.example_inputs(), dynamic=dynamic), info


def capture_hf(model: torch.nn.Module, *, task: str | None = None) -> tuple[torch.export.ExportedProgram, HFInfo]:
    """A Hugging Face model already in memory captured as :func:`export_hf_fx` captures a directory's:
    its task's wrapper, eager attention, dense experts (a mixture of experts), a state-space model's scan in
    closed form, in eval mode. The model is left as it was (its attention, experts and scan implementations and
    training mode restored)."""
    name = task or task_of(model.config, type(model).__name__)      # a config built in memory names no architectures
    chosen = HEADS.get(name)
    source = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    training, attention = model.training, getattr(model.config, "_attn_implementation", None)
    experts = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") else None
    try:
        if attention not in (None, "eager") and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation("eager")
        if not use_dense_experts(model):
            experts = None
        use_quadratic_scan(model)
        info = chosen.describe(model, Path(source), name)
        return export_fx(chosen.wrapper(model).eval(), info.example_inputs()), info
    finally:
        restore_scan(model)
        if attention not in (None, "eager") and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attention)
        if experts is not None:
            model.set_experts_implementation(experts)
        model.train(training)


def save_hf_fx(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    attention: str = "eager",
    overwrite: bool = False,
    task: str | None = None,
) -> Path:
    """Capture a Hugging Face classifier with ``torch.export`` and save it as
    ``out_dir/model.pt2`` (``torch.export.save``) next to copies of its task's files.

    ``rulegraph.load`` reads the ``.pt2`` file back as an fx program.

    Raises:
        FileNotFoundError: the directory, its ``config.json`` or (text) its ``tokenizer.json`` is missing.
        FileExistsError: ``out_dir`` already holds ``model.pt2`` or a file to copy and ``overwrite`` is false.
    """
    model_dir = _check_model_dir(model_dir)
    out_dir = Path(out_dir)
    model_path = out_dir / FX_FILE
    copies = _companions(model_dir, out_dir, model_path, overwrite, task)
    module, info = load_hf(model_dir, attention=attention, task=task)
    example = info.example_inputs()
    program = export_fx(module, example)
    verdict = verify(program, module, example, dynamic_axes(example), info.outputs, info.max_length, info.finish)
    if not verdict.ok:
        raise ExportError(f"{model_path}: the torch.export program does not compute what the module computes — "
                          f"{verdict.summary}; nothing was written")
    del module
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = {**info.metadata(), **ExportInfo(exporter="torch.export", outputs=info.outputs,
                                                 export_check=f"torch.export: {verdict.summary}").metadata()}
    from ..files import replacing
    with replacing(model_path, FX_FILE) as staged:
        torch.export.save(program, str(staged), extra_files={FX_METADATA: json.dumps(metadata)})
    _copy(copies)
    return model_path


def _check_model_dir(model_dir: str | os.PathLike) -> Path:
    """Return ``model_dir`` as a resolved path if it is a directory holding ``config.json``."""
    path = Path(model_dir).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}; expected a Hugging Face model directory (save_pretrained)")
    return path


def _text_info(model: torch.nn.Module, model_dir: Path, task: str) -> HFInfo:
    """Read labels (classifiers), maximum length and input names (the wrapper's, ``token_type_ids``
    only where the model has more than one token type) from a loaded text model's config."""
    config = model.config
    spec = HEADS.get(task)
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    inputs = tuple(inspect.signature(spec.wrapper.forward).parameters)[1:]
    forward_params = inspect.signature(model.forward).parameters
    if not (getattr(config, "type_vocab_size", 0) > 1 and "token_type_ids" in forward_params):
        inputs = tuple(i for i in inputs if i != "token_type_ids")
    return HFInfo(
        model_type=config.model_type,
        labels=_labels(config) if spec.labelled else (),
        max_length=_max_length(config),
        input_names=inputs,
        vocab_size=_vocab_size(model, model_dir),
        pad_token_id=getattr(config, "pad_token_id", None),
        source=str(model_dir),
        task=task,
        outputs=spec.outputs,
        decoder_start=_token_id(config, "decoder_start_token_id") if "decoder_input_ids" in inputs else None,
        # a language model's, and an encoder–decoder classifier's (each row must end in it)
        eos_token_id=_token_id(config, "eos_token_id") if not spec.labelled or encoder_decoder else None,
        encoder_decoder=encoder_decoder,
    )


def _token_id(config: object, name: str) -> int | None:
    """A token id the config names (the first, where it lists several), or ``None``."""
    value = getattr(config, name, None)
    value = value[0] if isinstance(value, (list, tuple)) and value else value
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _labels(config: object) -> tuple[str, ...]:
    return tuple(str(config.id2label[i]) for i in range(config.num_labels))


def _processor(model_dir: Path) -> dict:
    """The directory's ``preprocessor_config.json`` (an image processor's or a feature extractor's), or ``{}``."""
    if not (model_dir / PREPROCESSOR_FILE).is_file():
        return {}
    try:
        processor = json.loads((model_dir / PREPROCESSOR_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read {model_dir / PREPROCESSOR_FILE}: {error}") from None
    if not isinstance(processor, dict):
        raise ValueError(f"{model_dir / PREPROCESSOR_FILE} is not a JSON object")
    return processor


def _normalisation(processor: dict) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """An image processor's ``image_mean`` and ``image_std`` as tuples of floats (``None`` where it gives none)."""
    return tuple((tuple(float(v) for v in x) if isinstance(x, list) else None)
                 for x in (processor.get("image_mean"), processor.get("image_std")))


def _image_info(model: torch.nn.Module, model_dir: Path, task: str) -> HFInfo:
    """Labels and the input image's size from the config; the normalisation from the image
    processor's ``preprocessor_config.json`` when the directory has one."""
    config = model.config
    processor = _processor(model_dir)
    height, width = _image_size(config, processor, model_dir)
    mean, std = _normalisation(processor)
    return HFInfo(
        model_type=config.model_type,
        labels=_labels(config),
        max_length=None,
        input_names=("pixel_values",),
        vocab_size=0,
        pad_token_id=None,
        source=str(model_dir),
        task=task,
        image_size=(getattr(config, "num_channels", 3), height, width),
        image_mean=mean,
        image_std=std,
    )


def _audio_info(model: torch.nn.Module, model_dir: Path, task: str) -> HFInfo:
    """Labels from the config; the sampling rate and whether a clip is normalised from the feature extractor's
    ``preprocessor_config.json`` when the directory has one, else 16 kHz and normalised (Wav2Vec2's defaults)."""
    processor = _processor(model_dir)
    rate, normalize = processor.get("sampling_rate", 16_000), processor.get("do_normalize", True)
    if not isinstance(rate, int) or isinstance(rate, bool) or not 0 < rate <= MAX_SAMPLING_RATE:
        raise ValueError(f"{model_dir / PREPROCESSOR_FILE}: sampling_rate must be an integer in "
                         f"1…{MAX_SAMPLING_RATE:,}, got {rate!r}")
    if not isinstance(normalize, bool):
        raise ValueError(f"{model_dir / PREPROCESSOR_FILE}: do_normalize must be true or false, got {normalize!r}")
    config = model.config
    if getattr(model, "main_input_name", "input_values") == "input_features":      # Whisper: log-mel frames
        frames = 2 * getattr(config, "max_source_positions", 1500)
        return HFInfo(model_type=config.model_type, labels=_labels(config), max_length=None,
                      input_names=("input_features",), vocab_size=0, pad_token_id=None, source=str(model_dir),
                      task=task, sampling_rate=rate, features=(config.num_mel_bins, frames))
    return HFInfo(model_type=config.model_type, labels=_labels(config), max_length=None,
                  input_names=("input_values",), vocab_size=0, pad_token_id=None, source=str(model_dir), task=task,
                  sampling_rate=rate, normalize_audio=normalize)


def _speech_info(model: torch.nn.Module, model_dir: Path, task: str) -> HFInfo:
    """A speech-to-text model's: its clip's as an audio classifier's over log-mel features (:func:`_audio_info`:
    the sampling rate, the features' size), its decoder's as an encoder–decoder LM's (:func:`_text_info`), the
    longest target its decoder's position table covers (``max_target_positions``)."""
    audio = _audio_info(model, model_dir, task)
    if audio.features is None:
        raise ValueError(f"model type {model.config.model_type!r} does not read log-mel features (input_features); "
                         "rulegraph exports speech-to-text models over them (Whisper)")
    text = _text_info(model, model_dir, task)
    positions = getattr(model.config, "max_target_positions", None)
    return replace(text, max_length=positions if isinstance(positions, int) and positions > 0 else text.max_length,
                   sampling_rate=audio.sampling_rate, features=audio.features)


def _vision_lm_info(model: torch.nn.Module, model_dir: Path, task: str) -> HFInfo:
    """A vision–language model's: its text side as a causal LM's (:func:`_text_info`), its picture's size from the
    vision config, the normalisation from ``preprocessor_config.json`` when the directory has one, the image
    token and how many of them one picture takes (the rows of its projected features, computed once here)."""
    config = model.config
    vision = getattr(config, "vision_config", None)
    token = _token_id(config, "image_token_id")
    token = _token_id(config, "image_token_index") if token is None else token
    if vision is None or token is None:
        raise ValueError(f"model type {config.model_type!r} names no vision_config and image token; "
                         "rulegraph exports vision–language models that write image features at an image token")
    processor = _processor(model_dir)
    height, width = _image_size(vision, processor, model_dir)
    channels = getattr(vision, "num_channels", 3)
    mean, std = _normalisation(processor)
    text = _text_info(model, model_dir, task)
    return replace(
        text, vocab_size=max(text.vocab_size, token + 1), image_size=(channels, height, width), image_mean=mean,
        image_std=std, image_token_id=token, image_tokens=_image_tokens(model, (channels, height, width)))


def _image_tokens(model: torch.nn.Module, size: tuple[int, int, int]) -> int:
    """How many features (image tokens) ``model.get_image_features`` makes of one picture of ``size``."""
    with torch.no_grad():
        out = model.get_image_features(pixel_values=torch.zeros(1, *size, dtype=model.dtype))
    features = getattr(out, "pooler_output", out)
    features = features[0] if isinstance(features, (list, tuple)) else features
    if not isinstance(features, torch.Tensor) or features.dim() < 2:
        raise ValueError(f"model type {model.config.model_type!r}: get_image_features gives no [tokens, hidden] "
                         "features to count the image tokens by")
    return int(features.shape[-2])


_TOKENIZER = {TOKENIZER_FILE: "the model's fast tokenizer"}
# (before the text classifier: an audio classifier's class name ends alike, and the Auto class tells them apart)
HEADS.add("audio-classification", Head("AutoModelForAudioClassification", HFAudioClassifier, (PREPROCESSOR_FILE,),
                                       {}, _audio_info, _audio_example,
                                       architectures=("ForSequenceClassification", "ForAudioClassification"),
                                       labelled=True, by_auto_class=True))
HEADS.add("sequence-classification", Head("AutoModelForSequenceClassification", HFClassifier, (TOKENIZER_FILE,),
                                          _TOKENIZER, _text_info, _token_example,
                                          architectures=("ForSequenceClassification",), labelled=True))
HEADS.add("image-classification", Head("AutoModelForImageClassification", HFImageClassifier, (PREPROCESSOR_FILE,),
                                       {}, _image_info, _image_example, architectures=("ForImageClassification",),
                                       labelled=True))
HEADS.add("causal-lm", Head("AutoModelForCausalLM", HFClassifier, (TOKENIZER_FILE,), _TOKENIZER, _text_info,
                            _token_example, architectures=("ForCausalLM", "LMHeadModel")))
HEADS.add("question-answering", Head("AutoModelForQuestionAnswering", HFQuestionAnswering, (TOKENIZER_FILE,),
                                     _TOKENIZER, _text_info, _token_example, outputs=("start_logits", "end_logits"),
                                     architectures=("ForQuestionAnswering",)))
# (before the encoder–decoder LM: their class names end alike, and the Auto class tells them apart)
HEADS.add("image-text-to-text", Head("AutoModelForImageTextToText", HFVisionLM, (TOKENIZER_FILE, PREPROCESSOR_FILE),
                                     _TOKENIZER, _vision_lm_info, _vision_lm_example,
                                     architectures=("ForConditionalGeneration",), by_auto_class=True))
HEADS.add("speech-seq2seq", Head("AutoModelForSpeechSeq2Seq", HFSpeechSeq2Seq, (TOKENIZER_FILE, PREPROCESSOR_FILE),
                                 {PREPROCESSOR_FILE: "the model's feature extractor"}, _speech_info, _speech_example,
                                 architectures=("ForConditionalGeneration",), by_auto_class=True))
HEADS.add("seq2seq-lm", Head("AutoModelForSeq2SeqLM", HFSeq2SeqLM, (TOKENIZER_FILE,), _TOKENIZER, _text_info,
                             _token_example, architectures=("ForConditionalGeneration", "MTModel")))


def _vocab_size(model: torch.nn.Module, model_dir: Path) -> int:
    """The token vocabulary's size: ``config.vocab_size``, else the rows of the input embeddings, else
    :data:`CODE_POINTS` (a model reading characters, CANINE)."""
    size = getattr(model.config, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):      # CANINE hashes code points: no table
        embeddings = None
    rows = getattr(embeddings, "num_embeddings", None)
    return rows if isinstance(rows, int) and rows > 0 else CODE_POINTS


def _image_size(config: object, processor: dict, model_dir: Path) -> tuple[int, int]:
    """The input image's (height, width): ``config.image_size``, else the image processor's ``crop_size``,
    then ``size`` (``height``/``width``, ``shortest_edge`` or an int)."""
    for value in (getattr(config, "image_size", None), processor.get("crop_size"), processor.get("size")):
        if isinstance(value, dict):
            value = (value.get("height"), value.get("width")) if "height" in value else value.get("shortest_edge")
        if isinstance(value, int) and value > 0:
            return value, value
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
            return int(value[0]), int(value[1])
    where = f"{model_dir / PREPROCESSOR_FILE} gives no crop_size or size" if processor else \
        f"there is no {PREPROCESSOR_FILE} in {model_dir}"
    raise ValueError(f"{getattr(config, 'model_type', 'the')} config has no image_size and {where}; save the "
                     "model's image processor there (or add \"image_size\" to config.json)")


def _max_length(config: object) -> int | None:
    """The longest sequence the position embeddings cover.

    RoBERTa-style models number positions from ``pad_token_id + 1``, so that many
    embedding rows (two, usually) are out of reach.
    """
    positions = getattr(config, "max_position_embeddings", None)
    if not isinstance(positions, int) or isinstance(positions, bool) or positions <= 0:
        return None            # no limit stated (XLNet's relative positions say -1)
    if getattr(config, "model_type", None) in PADDING_OFFSET_MODEL_TYPES:
        return positions - (getattr(config, "pad_token_id", None) or 0) - 1
    return positions


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """Hide transformers' weight-loading progress bars for the duration."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
