"""Shared fixtures: tiny random-weight transformers exported once per session."""
from __future__ import annotations

import pytest
import torch

import tiny


@pytest.fixture(scope="session")
def bert():
    """A tiny BERT classifier (eager attention) in float64, for references."""
    return tiny.build("bert")


@pytest.fixture(scope="session")
def bert_onnx(tmp_path_factory, bert):
    """The tiny BERT exported with the TorchScript exporter (+ its tokenizer.json beside it)."""
    folder = tmp_path_factory.mktemp("bert_ts")
    path = tiny.onnx(bert, folder / "model.onnx")
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    return path


@pytest.fixture(scope="session")
def bert_dynamo_onnx(tmp_path_factory, bert):
    """The tiny BERT exported with the dynamo exporter."""
    return tiny.onnx(bert, tmp_path_factory.mktemp("bert_dynamo") / "model.onnx", exporter="dynamo")


@pytest.fixture(scope="session")
def bert_sdpa_onnx(tmp_path_factory):
    """The same architecture exported with SDPA attention (Softmax guarded by IsNaN/Where)."""
    return tiny.onnx(tiny.build("bert", attention="sdpa"), tmp_path_factory.mktemp("bert_sdpa") / "model.onnx")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)
