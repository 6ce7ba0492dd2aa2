"""What rulegraph learns about a model once (``rulegraph.facts``): the inputs' roles and the token
table (also a dequantized one), the one filler of inputs from token ids, and each output's kind from
one cached probe that every door (explain, the dataset jobs, generation) reads."""
from __future__ import annotations

import warnings

import pytest
import torch

import rulegraph
import tiny
from rulegraph import facts
from rulegraph.facts import Roles, output_kind, roles, token_feeds, token_input
from rulegraph.methods.sequences import zero_embedding_lookup


def test_roles_of_a_bert_export(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    found = roles(graph)
    assert isinstance(found, Roles) and found is roles(graph) is graph.cache.roles
    assert (found.ids, found.mask, found.types, found.prefix) == ("input_ids", "attention_mask", "token_type_ids",
                                                                  None)
    word = tiny.build("bert").bert.embeddings.word_embeddings.weight
    assert graph.constants[found.table.table].shape == word.shape      # the largest table: the words'
    assert token_input(graph) == "input_ids" and zero_embedding_lookup(graph) is found.table.node


@pytest.mark.parametrize("how", ["dynamic", "static"])
def test_the_token_table_is_found_when_dequantized(tmp_path, how):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    names = ("input_ids", "attention_mask", "token_type_ids")
    source = tiny.onnx(tiny.build("bert"), tmp_path / "float.onnx", names=names)
    out = tmp_path / "q.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "dynamic":
            quantize_dynamic(str(source), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["Gather"])
        else:
            from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
            feeds = iter([{k: v.numpy() for k, v in tiny.token_inputs(names, length=9, seed=s).items()} for s in range(2)])

            class Reader(CalibrationDataReader):
                def get_next(self):
                    return next(feeds, None)
            quantize_static(str(source), str(out), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["Gather"],
                            weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    graph = rulegraph.load(out)
    table = roles(graph).table
    assert table is not None and table.source == "input_ids"
    # dynamic: the DequantizeLinear of the rows read; static (QDQ): a Gather of the dequantized table. Neither
    # is a Gather of a float initializer, the only lookup a finder of its own once accepted
    assert table.node.op != "Gather" or table.node.inputs[0] not in graph.constants
    from rulegraph.boundary import constant_value
    assert constant_value(graph, table.table).shape[0] == len(tiny.VOCAB)
    assert roles(rulegraph.load(source)).table.node.op == "Gather"
    with pytest.raises(rulegraph.errors.InputError, match="removal 'zero' needs a token-embedding lookup"):
        zero_embedding_lookup(graph)


def test_token_feeds_fill_what_the_graph_takes(bert_onnx):
    graph = rulegraph.load(bert_onnx)
    ids = torch.tensor([[2, 5, 6, 3]])
    feeds = token_feeds(graph, ids)
    assert list(feeds) == graph.input_names
    assert torch.equal(feeds["input_ids"], ids) and torch.equal(feeds["attention_mask"], torch.ones_like(ids))
    assert torch.equal(feeds["token_type_ids"], torch.zeros_like(ids))
    mask = torch.tensor([[1, 1, 0, 0]])
    given = torch.tensor([[0, 0, 1, 1]])
    feeds = token_feeds(graph, ids, mask=mask, given={"token_type_ids": given})
    assert feeds["attention_mask"] is mask and feeds["token_type_ids"] is given


def test_the_filler_is_what_text_and_the_command_line_fill(bert_onnx):
    from rulegraph.cli.inputs import requests_of
    from rulegraph.text import TextEncoder
    graph = rulegraph.load(bert_onnx)
    encoder = TextEncoder(bert_onnx.parent / "tokenizer.json")
    encoded = encoder.encode("w1 w2 w3")
    filled = encoder.fill(graph, encoded, {})
    ids = encoded.inputs["input_ids"]
    expected = token_feeds(graph, ids, mask=encoded.inputs["attention_mask"], types=encoded.inputs["token_type_ids"])
    assert filled.keys() == expected.keys() and all(torch.equal(filled[k], expected[k]) for k in filled)
    (request,) = requests_of(graph, (), ("input_ids=2,5,6,3",))
    assert all(torch.equal(request["inputs"][k], v) for k, v in token_feeds(graph, torch.tensor([[2, 5, 6, 3]])).items())


def test_a_classifier_output_kind_is_probed_once(bert_onnx, monkeypatch):
    graph = rulegraph.load(bert_onnx)
    kind = output_kind(graph)
    assert kind.shape == (1, 2) and not kind.positions and not kind.vocabulary_scores and not kind.position_scores
    calls = []
    monkeypatch.setattr(facts, "probe_output", lambda *a, **k: calls.append(a))
    from rulegraph.api import _has_positions
    assert output_kind(graph) is kind
    assert not _has_positions(graph, tiny.token_inputs(length=5), None)
    assert calls == []


def test_a_language_model_output_kind(causal_lm):
    module, path = causal_lm
    graph = rulegraph.load(path)
    kind = output_kind(graph, feeds=tiny.token_inputs(("input_ids", "attention_mask"), length=6))
    assert kind.positions and kind.vocabulary_scores and kind.shape == (1, 6, module.config.vocab_size)
    assert output_kind(graph) is kind


def test_an_export_stating_its_task_needs_no_probe(causal_lm, monkeypatch):
    """``rulegraph export`` records the task: a language model's logits have positions, without a forward."""
    _, path = causal_lm
    graph = rulegraph.load(path)
    assert graph.metadata["rulegraph.task"] == "causal-lm"
    monkeypatch.setattr(facts, "probe_output", lambda *a, **k: pytest.fail("probed"))
    assert facts.has_positions(graph)
    from rulegraph.scale.job import is_causal
    assert is_causal(graph, None)                 # no example read either
    unstated = rulegraph.load(path)
    del unstated.metadata["rulegraph.task"]
    with pytest.raises(pytest.fail.Exception, match="probed"):
        facts.has_positions(unstated, feeds=lambda: tiny.token_inputs(("input_ids", "attention_mask")))


def test_the_token_input_is_the_first_listed_of_equal_tables(tmp_path):
    """GPT-2 reads its token types from the word table too; an optimizer may reorder the two lookups:
    the ids are still the input the graph lists first (here input_ids), not token_type_ids."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    import rulegraph
    from rulegraph.facts import roles
    table = numpy_helper.from_array(np.ones((5, 3), np.float32), "wte")
    nodes = [helper.make_node("Gather", ["wte", "token_type_ids"], ["t"]),        # the types' lookup first
             helper.make_node("Gather", ["wte", "input_ids"], ["w"]), helper.make_node("Add", ["w", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.INT64, ["b", "s"])
                                           for n in ("input_ids", "token_type_ids")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 3])], [table])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert roles(rulegraph.load(path)).ids == "input_ids"
