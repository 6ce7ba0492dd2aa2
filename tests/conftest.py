"""Shared fixtures: tiny random-weight transformers exported once per session (once per worker process where
pytest-xdist runs the suite, as ``make test`` does)."""
from __future__ import annotations

import os

import pytest
import torch

import tiny


@pytest.fixture(scope="session")
def bert():
    """A tiny BERT classifier (eager attention) in float64, for references."""
    return tiny.build("bert")


@pytest.fixture(scope="session")
def bert_onnx(tmp_path_factory):
    """The tiny BERT (the ``bert`` fixture's weights, built afresh in float32: tests turn the shared
    module into float64 in place) exported with the TorchScript exporter (+ its tokenizer.json beside it)."""
    folder = tmp_path_factory.mktemp("bert_ts")
    path = tiny.onnx(tiny.build("bert"), folder / "model.onnx")
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    return path


@pytest.fixture(scope="session")
def bert_dynamo_onnx(tmp_path_factory):
    """The tiny BERT exported with the dynamo exporter (built afresh in float32, as ``bert_onnx``)."""
    return tiny.onnx(tiny.build("bert"), tmp_path_factory.mktemp("bert_dynamo") / "model.onnx", exporter="dynamo")


@pytest.fixture(scope="session")
def bert_sdpa_onnx(tmp_path_factory):
    """The same architecture exported with SDPA attention (Softmax guarded by IsNaN/Where)."""
    return tiny.onnx(tiny.build("bert", attention="sdpa"), tmp_path_factory.mktemp("bert_sdpa") / "model.onnx")


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def causal_lm(request, tmp_path_factory):
    """A tiny causal LM (GPT-2, and Llama style with GQA and rotary positions) saved with
    ``save_pretrained`` and exported by ``rulegraph export``'s exporter: (HF module, model.onnx path)."""
    from rulegraph.exporters import export_hf
    folder = tmp_path_factory.mktemp(f"lm_{request.param}")
    module = tiny.save_causal_lm(request.param, folder / "hf")
    return module, export_hf(folder / "hf", folder / "export")


#: torch's threads in a test: two, or one in each of pytest-xdist's worker processes (two workers share two cores)
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)
