"""Load Hugging Face models and export them to ONNX or torch.fx.

A Hugging Face model directory (as written by ``save_pretrained``) holds
``config.json``, the weights and, for export, the fast tokenizer's
``tokenizer.json``. :func:`export_hf` turns it into ``model.onnx`` plus a copy of
``tokenizer.json``, with the labels and maximum length in the ONNX metadata.

Which head is exported is a *task* of :data:`TASKS` (sequence classification, span
question answering, encoder–decoder LM): a wrapper module with plain named inputs and
outputs. The task is read off ``config.architectures`` unless given.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import torch

from ..errors import InputError
from ..loaders import FX_METADATA
from ..registry import Registry
from .to_fx import export_fx
from .to_onnx import check_exporter_options, export_onnx, refuse_overwrite

#: Attention implementations :func:`load_hf` accepts. ``eager`` gives explicit Softmax and MatMul nodes.
ATTENTIONS = ("eager", "sdpa")
#: Model types whose position ids start after the padding index (RoBERTa style).
PADDING_OFFSET_MODEL_TYPES = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm", "data2vec-text", "longformer", "mpnet"}
)
#: ONNX file and tokenizer file names in an export directory.
MODEL_FILE = "model.onnx"
FX_FILE = "model.pt2"
TOKENIZER_FILE = "tokenizer.json"
#: Metadata keys written by :func:`export_hf`.
LABELS_KEY = "rulegraph.labels"
MAX_LENGTH_KEY = "rulegraph.max_length"
MODEL_TYPE_KEY = "rulegraph.model_type"
SOURCE_KEY = "rulegraph.source"
TASK_KEY = "rulegraph.task"


@dataclass(frozen=True)
class HFInfo:
    """What an exporter and an explainer need to know about a Hugging Face classifier.

    Attributes:
        model_type: ``config.model_type`` (``"bert"``, ``"gpt2"``, ...).
        labels: class names in logit order, from ``config.id2label``.
        max_length: the longest token sequence the position embeddings allow, or
            ``None`` if the model has no such limit in its config.
        input_names: the inputs the model takes: ``input_ids``, ``attention_mask`` and,
            for models with more than one token type (BERT), ``token_type_ids``.
        vocab_size: the size of the token vocabulary.
        pad_token_id: the padding token id from the config, or ``None``.
        source: the model directory, resolved.
        task: the :data:`TASKS` entry exported (default ``sequence-classification``).
        outputs: the graph's output names.
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

    def metadata(self) -> dict[str, str]:
        """The ONNX ``metadata_props`` entries describing this model."""
        props = {
            LABELS_KEY: json.dumps(list(self.labels)),
            MODEL_TYPE_KEY: self.model_type,
            SOURCE_KEY: self.source,
            TASK_KEY: self.task,
        }
        if self.max_length is not None:
            props[MAX_LENGTH_KEY] = str(self.max_length)
        return props

    def example_inputs(self, batch: int = 2, length: int = 8) -> dict[str, torch.Tensor]:
        """Deterministic example inputs for tracing: the last row is right-padded.

        The padding matters: traced code that takes a shortcut for an all-ones mask
        would otherwise bake that shortcut into the export.
        """
        if batch < 2 or length < 4:
            raise ValueError("example inputs need batch >= 2 and length >= 4 so padding and dynamic axes are traced")
        first = 1 if self.pad_token_id == 0 else 0
        ids = first + torch.arange(batch * length).reshape(batch, length) % (self.vocab_size - first)
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[-1, length // 2 + 1 :] = 0
        if self.pad_token_id is not None:
            ids = ids.masked_fill(mask == 0, self.pad_token_id)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            inputs["token_type_ids"] = torch.zeros(batch, length, dtype=torch.long)
        if "decoder_input_ids" in self.input_names:       # a target prefix of another length than the source
            inputs["decoder_input_ids"] = ids[:, : length - 2]
        return inputs


class HFClassifier(torch.nn.Module):
    """A Hugging Face sequence classifier as ``forward(input_ids, attention_mask[, token_type_ids]) -> logits``.

    Inputs are passed on by keyword, ``use_cache=False`` is passed when the model
    takes it (GPT-2 style), and only the ``logits`` tensor is returned, so the module
    exports to a graph with plain named inputs and a single output.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.training = model.training
        self._takes_use_cache = "use_cache" in inspect.signature(model.forward).parameters

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return the classification logits, shape ``(batch, num_labels)``."""
        kwargs: dict[str, object] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        if self._takes_use_cache:
            kwargs["use_cache"] = False
        return self.model(**kwargs).logits


class HFSeq2SeqLM(torch.nn.Module):
    """A Hugging Face encoder–decoder LM (BART, T5, Marian…) as
    ``forward(input_ids, attention_mask, decoder_input_ids) -> logits`` ``[batch, target, vocab]``.

    The decoder's ids are a graph input (not shifted from labels inside the model), so the
    exported graph looks up the decoder-side token embeddings from an integer input and the
    relevance boundary reads them like the encoder's; ``use_cache=False``, only the logits.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.training = model.training

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """Return the next-token logits at every target position, ``(batch, target, vocab)``."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                          use_cache=False).logits


class HFQuestionAnswering(torch.nn.Module):
    """A Hugging Face span-QA model (``…ForQuestionAnswering``) as
    ``forward(input_ids, attention_mask[, token_type_ids]) -> (start_logits, end_logits)``,
    each ``(batch, positions)``: the explained "class" of either output is a token position."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.training = model.training

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        kwargs: dict[str, object] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        out = self.model(**kwargs)
        return out.start_logits, out.end_logits


@dataclass(frozen=True)
class Task:
    """One exportable Hugging Face head: the ``transformers`` Auto class that loads it, the wrapper
    giving it plain named inputs and outputs, and the ``config.architectures`` endings naming it."""

    auto: str
    wrapper: type[torch.nn.Module]
    outputs: tuple[str, ...]
    architectures: tuple[str, ...]
    labelled: bool = False          # the output's last axis is the config's classes (id2label)


#: task name → :class:`Task`; ``rulegraph export --task`` and :func:`load_hf` take these names
TASKS: Registry[Task] = Registry("task", InputError)
TASKS.add("sequence-classification", Task("AutoModelForSequenceClassification", HFClassifier, ("logits",),
                                          ("ForSequenceClassification",), labelled=True))
TASKS.add("question-answering", Task("AutoModelForQuestionAnswering", HFQuestionAnswering,
                                     ("start_logits", "end_logits"), ("ForQuestionAnswering",)))
TASKS.add("seq2seq-lm", Task("AutoModelForSeq2SeqLM", HFSeq2SeqLM, ("logits",),
                             ("ForConditionalGeneration", "MTModel")))
DEFAULT_TASK = "sequence-classification"


def task_of(config: object) -> str:
    """The task ``config.architectures`` names (the first head that matches), else sequence classification."""
    for architecture in getattr(config, "architectures", None) or ():
        for name in TASKS:
            if architecture.endswith(TASKS.get(name).architectures):
                return name
    return DEFAULT_TASK


def load_hf(
    model_dir: str | os.PathLike,
    *,
    attention: str = "eager",
    num_labels: int | None = None,
    task: str | None = None,
) -> tuple[torch.nn.Module, HFInfo]:
    """Load a model from a Hugging Face model directory, in eval mode, wrapped for export.

    Args:
        model_dir: a directory written by ``save_pretrained`` (``config.json`` + weights).
        attention: ``"eager"`` (explicit Softmax/MatMul; the default) or ``"sdpa"``.
        num_labels: override the number of classes; a head of a different size is
            newly initialised by transformers.
        task: a :data:`TASKS` name; default: the one ``config.architectures`` names.

    Raises:
        FileNotFoundError: the directory or its ``config.json`` is missing.
        ValueError: unknown attention, or the model type has no head for the task.
        InputError: unknown task.
    """
    import transformers
    from transformers import AutoConfig

    model_dir = _check_model_dir(model_dir)
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}; valid: {', '.join(ATTENTIONS)}")
    overrides = {} if num_labels is None else {"num_labels": num_labels}
    config = AutoConfig.from_pretrained(model_dir, **overrides)
    task = task or task_of(config)
    spec = TASKS.get(task)
    try:
        with _no_progress_bars():
            model = getattr(transformers, spec.auto).from_pretrained(
                model_dir, config=config, attn_implementation=attention
            )
    except ValueError as error:
        if "Unrecognized configuration class" not in str(error):
            raise
        raise ValueError(f"model type {config.model_type!r} in {model_dir} has no {task} head in transformers") from None
    return spec.wrapper(model).eval(), _info(model, model_dir, task)


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
) -> Path:
    """Export a Hugging Face model to ``out_dir/model.onnx`` next to a copy of its ``tokenizer.json``.

    The ONNX file has inputs named as in :attr:`HFInfo.input_names` with dynamic
    ``batch`` and ``sequence`` axes (``decoder_sequence`` for a decoder's inputs), the
    outputs of the ``task`` (:data:`TASKS`; default from ``config.architectures``: ``logits``,
    or ``start_logits`` and ``end_logits`` for span QA), and metadata
    ``rulegraph.labels`` (JSON list), ``rulegraph.max_length``,
    ``rulegraph.model_type``, ``rulegraph.task``, ``rulegraph.source`` and ``rulegraph.exporter``;
    entries in ``metadata`` are added and take precedence.

    Returns:
        the path of ``model.onnx``.

    Raises:
        FileNotFoundError: the directory, its ``config.json`` or its ``tokenizer.json`` is missing.
        FileExistsError: ``out_dir`` already holds ``model.onnx`` or ``tokenizer.json`` and ``overwrite`` is false.
        ValueError: unknown exporter or attention, or an opset below 17.
    """
    model_dir = _check_model_dir(model_dir)
    check_exporter_options(exporter, opset)
    tokenizer = model_dir / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {model_dir}; save the model's fast tokenizer there")
    out_dir = Path(out_dir)
    model_path, tokenizer_copy = out_dir / MODEL_FILE, out_dir / TOKENIZER_FILE
    if not overwrite:
        refuse_overwrite(model_path)
        refuse_overwrite(tokenizer_copy)
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
    )
    shutil.copyfile(tokenizer, tokenizer_copy)
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


def save_hf_fx(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    attention: str = "eager",
    overwrite: bool = False,
    task: str | None = None,
) -> Path:
    """Capture a Hugging Face model with ``torch.export`` and save it as
    ``out_dir/model.pt2`` (``torch.export.save``) next to a copy of its ``tokenizer.json``.

    ``rulegraph.load`` reads the ``.pt2`` file back as an fx program.

    Raises:
        FileNotFoundError: the directory, its ``config.json`` or its ``tokenizer.json`` is missing.
        FileExistsError: ``out_dir`` already holds ``model.pt2`` or ``tokenizer.json`` and ``overwrite`` is false.
    """
    model_dir = _check_model_dir(model_dir)
    tokenizer = model_dir / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {model_dir}; save the model's fast tokenizer there")
    out_dir = Path(out_dir)
    model_path, tokenizer_copy = out_dir / FX_FILE, out_dir / TOKENIZER_FILE
    if not overwrite:
        refuse_overwrite(model_path)
        refuse_overwrite(tokenizer_copy)
    program, info = export_hf_fx(model_dir, attention=attention, task=task)
    out_dir.mkdir(parents=True, exist_ok=True)
    metadata = {**info.metadata(), "rulegraph.exporter": "torch.export", "rulegraph.outputs": json.dumps(list(info.outputs))}
    torch.export.save(program, str(model_path), extra_files={FX_METADATA: json.dumps(metadata)})
    shutil.copyfile(tokenizer, tokenizer_copy)
    return model_path


def _check_model_dir(model_dir: str | os.PathLike) -> Path:
    """Return ``model_dir`` as a resolved path if it is a directory holding ``config.json``."""
    path = Path(model_dir).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"model directory not found: {path}")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}; expected a Hugging Face model directory (save_pretrained)")
    return path


def _info(model: torch.nn.Module, model_dir: Path, task: str = DEFAULT_TASK) -> HFInfo:
    """Read labels, maximum length and input names from a loaded model's config."""
    config = model.config
    spec = TASKS.get(task)
    labels = tuple(str(config.id2label[i]) for i in range(config.num_labels)) if spec.labelled else ()
    inputs = tuple(inspect.signature(spec.wrapper.forward).parameters)[1:]
    forward_params = inspect.signature(model.forward).parameters
    if not (getattr(config, "type_vocab_size", 0) > 1 and "token_type_ids" in forward_params):
        inputs = tuple(i for i in inputs if i != "token_type_ids")
    return HFInfo(
        model_type=config.model_type,
        labels=labels,
        max_length=_max_length(config),
        input_names=inputs,
        vocab_size=config.vocab_size,
        pad_token_id=config.pad_token_id,
        source=str(model_dir),
        task=task,
        outputs=spec.outputs,
    )


def _max_length(config: object) -> int | None:
    """The longest sequence the position embeddings cover.

    RoBERTa-style models number positions from ``pad_token_id + 1``, so that many
    embedding rows (two, usually) are out of reach.
    """
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
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
