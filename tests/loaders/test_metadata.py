"""The export metadata schema (``rulegraph.loaders.metadata``): one declaration per ``rulegraph.*`` key,
written by the exporter from it, read back typed, checked once per graph with errors naming file and key."""
from __future__ import annotations

import json
from dataclasses import fields

import pytest

import rulegraph
from rulegraph.errors import ModelError
from rulegraph.exporters import HFInfo
from rulegraph.ir import Graph
from rulegraph.loaders.metadata import KEY, KEYS, ExportInfo, check, export_info, labels, parse

FULL = ExportInfo(model_type="bart", source="/m", task="sequence-classification", labels=("a", "b"), max_length=64,
                  image_size=(3, 8, 8), image_mean=(0.5, 0.5, 0.5), image_std=(0.25, 0.25, 0.25),
                  sampling_rate=16000, normalize_audio=True, decoder_start_token_id=2, eos_token_id=2,
                  image_token_id=99, image_tokens=16, exporter="torch.export", outputs=("logits",), export_check="ok")


def _graph(metadata: dict[str, str]) -> Graph:
    return Graph([], [], [], {}, opset=17, metadata=metadata, source="onnx:/models/m.onnx")


def test_every_key_is_declared_once_with_its_field():
    assert [k.field for k in KEYS] == [f.name for f in fields(ExportInfo)]
    assert len({k.name for k in KEYS}) == len(KEYS) and all(k.name == f"rulegraph.{k.field}" for k in KEYS)
    assert KEY["eos_token_id"].name == "rulegraph.eos_token_id" and KEY["task"].name == "rulegraph.task"


def test_written_then_read_back_is_the_same():
    written = FULL.metadata()
    assert list(written) == [k.name for k in KEYS]
    assert parse(written) == FULL
    assert ExportInfo(max_length=3).metadata() == {"rulegraph.max_length": "3"}
    assert parse({}) == ExportInfo()


def test_the_exporter_writes_from_the_schema():
    info = HFInfo(model_type="bert", labels=("neg", "pos"), max_length=512, input_names=("input_ids",),
                  vocab_size=100, pad_token_id=0, source="/m", eos_token_id=7)
    written = info.metadata()
    assert written == {"rulegraph.model_type": "bert", "rulegraph.source": "/m",
                       "rulegraph.task": "sequence-classification", "rulegraph.labels": '["neg", "pos"]',
                       "rulegraph.max_length": "512", "rulegraph.eos_token_id": "7"}
    assert list(written) == ["rulegraph.model_type", "rulegraph.source", "rulegraph.task", "rulegraph.labels",
                             "rulegraph.max_length", "rulegraph.eos_token_id"]
    read = parse(written)
    assert (read.labels, read.max_length, read.eos_token_id, read.task) == (("neg", "pos"), 512, 7,
                                                                            "sequence-classification")
    assert "rulegraph.labels" not in HFInfo("gpt2", (), None, ("input_ids",), 100, None, "/m", task="causal-lm").metadata()


@pytest.mark.parametrize("key, raw", [
    ("rulegraph.eos_token_id", "end"), ("rulegraph.eos_token_id", "-1"), ("rulegraph.labels", '["a", "a"]'),
    ("rulegraph.labels", "a, b"), ("rulegraph.max_length", "0"), ("rulegraph.decoder_start_token_id", "1.5"),
    ("rulegraph.image_std", "[1, 0, 1]"), ("rulegraph.outputs", '[""]'), ("rulegraph.sampling_rate", "0"),
    ("rulegraph.sampling_rate", "44100.0"), ("rulegraph.sampling_rate", "1000001"), ("rulegraph.normalize_audio", "1"),
    ("rulegraph.image_token_id", "-3"), ("rulegraph.image_tokens", "0"),
])
def test_a_bad_value_is_one_error_naming_the_file_and_key(key, raw):
    with pytest.raises(ModelError, match=rf"^/models/m\.onnx: the export's metadata {key} must be .*, got "):
        check(_graph({key: raw}))


def test_parsed_once_per_graph_and_labels_read_through_it():
    graph = _graph({"rulegraph.labels": json.dumps(["x", "y"]), "rulegraph.task": "sequence-classification"})
    assert export_info(graph) is export_info(graph) is graph.cache.info[1]
    assert labels(graph) == ["x", "y"] and labels(_graph({})) is None
    graph.metadata["rulegraph.labels"] = json.dumps(["z"])            # changed after loading: read again
    assert labels(graph) == ["z"]
    from rulegraph.passes import base
    assert base.labels is labels          # one validation, re-exported where it was


def test_a_loaded_export_reads_its_info(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    assert graph.cache.info is not None                 # checked at load
    assert export_info(graph) == parse(graph.metadata)
