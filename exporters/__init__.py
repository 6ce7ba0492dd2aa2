"""Turn torch modules and Hugging Face classifiers into files rulegraph can explain.

* :func:`export_onnx` — any module to a checked ONNX file (TorchScript or dynamo
  exporter) with named inputs, dynamic ``batch``/``sequence`` axes and metadata.
* :func:`export_fx` — any module to a :class:`torch.export.ExportedProgram`.
* :func:`load_hf`, :func:`export_hf`, :func:`export_hf_fx`, :func:`save_hf_fx` — the same
    for a Hugging Face model directory, via the wrapper of its task (:data:`HEADS`: sequence and
    image classification, causal LM, span question answering, encoder–decoder LM).
* :func:`read_metadata` — the ``metadata_props`` of an ONNX file.

Transformers is needed only for the Hugging Face functions.
"""
from .hf import (ATTENTIONS, HEADS, HFAudioClassifier, HFClassifier, HFImageClassifier, HFInfo, HFQuestionAnswering, HFSeq2SeqLM, Head,
                 export_hf, export_hf_fx, load_hf, save_hf_fx)
from .to_fx import export_fx
from .to_onnx import EXPORTERS, MIN_OPSET, export_onnx, read_metadata

__all__ = [
    "ATTENTIONS",
    "EXPORTERS",
    "MIN_OPSET",
    "HEADS",
    "HFClassifier",
    "HFAudioClassifier",
    "HFImageClassifier",
    "HFInfo",
    "HFQuestionAnswering",
    "HFSeq2SeqLM",
    "Head",
    "export_fx",
    "export_hf",
    "export_hf_fx",
    "export_onnx",
    "load_hf",
    "read_metadata",
    "save_hf_fx",
]
