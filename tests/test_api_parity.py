"""The Python API takes what the command line takes: any method by name, class names and token text
as targets, a list of texts (a padded batch), numpy and torch integers, a tokenizer object, and a
Hugging Face module in memory; explanations carry the tokens and the names of what they explain."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

import rulegraph
import tiny
from rulegraph.errors import InputError

TEXT = "w1 w2 w3 w4"


def test_a_baseline_is_a_method_of_explain(bert_onnx):
    e = rulegraph.explain(bert_onnx, "ig", text=TEXT, steps=4)
    assert e.extra["method"] == "ig" and e.audit is None and len(e.tokens[0]) == 6


@pytest.mark.parametrize("target", [1, np.int64(1), torch.tensor(1), "positive"])
def test_a_class_by_index_numpy_torch_or_name(bert_onnx, target):
    e = rulegraph.explain(bert_onnx, "gi", text=TEXT, target=target)
    assert e.target == [1] and e.name(1) == "positive" and e.to_dict()["target_name"] == "positive"


def test_a_class_name_that_is_not_one_is_refused_with_the_classes(bert_onnx):
    with pytest.raises(InputError, match=r"target '\[PAD\]' is not a class of this model; its classes: negative, "
                                         r"positive"):
        rulegraph.explain(bert_onnx, "gi", text=TEXT, target="[PAD]")


def test_a_list_of_texts_is_one_padded_batch_equal_to_one_by_one(bert_onnx):
    texts = [TEXT, "w5 w6", "w7 w8 w9 w10 w11"]
    batch = rulegraph.explain(bert_onnx, "lrp-ah-ln", text=texts, dtype=torch.float64)
    assert batch.batch_size == 3 and [len(t) for t in batch.tokens] == [6, 4, 7]
    for item, text in enumerate(texts):
        one = rulegraph.explain(bert_onnx, "lrp-ah-ln", text=text, dtype=torch.float64)
        n = len(one.tokens[0])
        torch.testing.assert_close(batch.relevance["input_ids"][item, :n], one.relevance["input_ids"][0],
                                   rtol=0, atol=1e-12)
        assert batch.texts[item] == one.texts[0]


def test_language_model_targets_as_token_text_are_named(causal_lm):
    _, path = causal_lm
    e = rulegraph.explain(path, "gi", text="w1 w2 w3", target=" w5", contrast=" w7")
    vocab = tiny.lm_tokenizer()
    w5, w7 = vocab.token_to_id("w5"), vocab.token_to_id("w7")
    assert e.target == [w5] and e.contrast == [w7]
    assert e.name(w5) == f"'w5' ({w5})" and e.to_dict()["contrast_name"] == f"'w7' ({w7})"
    assert f"logits['w5' ({w5})] − logits['w7' ({w7})]" in repr(e)


def test_a_list_of_texts_on_a_language_model_is_explained_at_each_last_token(causal_lm):
    _, path = causal_lm
    batch = rulegraph.explain(path, "gi", text=["w1 w2 w3", "w4 w5"], dtype=torch.float64)
    assert batch.position == [2, 1]
    one = rulegraph.explain(path, "gi", text="w4 w5", dtype=torch.float64)
    assert batch.target[1] == one.target[0]
    torch.testing.assert_close(batch.relevance["input_ids"][1, :2], one.relevance["input_ids"][0], rtol=0, atol=1e-12)


def test_a_tokenizer_object_and_ids_given_as_inputs_are_shown_as_tokens(bert_onnx, tmp_path):
    tokenizer = Tokenizer.from_file(str(bert_onnx.parent / "tokenizer.json"))
    e = rulegraph.explain(rulegraph.load(bert_onnx), "gi", text=TEXT, tokenizer=tokenizer)
    assert e.tokens[0] == ["[CLS]", "w1", "w2", "w3", "w4", "[SEP]"]
    ids = tiny.tokenizer().encode(TEXT).ids
    f = rulegraph.explain(bert_onnx, "gi", {"input_ids": torch.tensor([ids]),
                                             "attention_mask": torch.ones(1, len(ids), dtype=torch.int64),
                                             "token_type_ids": torch.zeros(1, len(ids), dtype=torch.int64)})
    assert f.tokens[0] == e.tokens[0] and [t.strip() for t in f.texts[0]] == e.tokens[0]


def test_a_hugging_face_module_in_memory_explains_like_its_export(bert, bert_onnx):
    module = tiny.build("bert")
    tokenizer = Tokenizer.from_file(str(bert_onnx.parent / "tokenizer.json"))
    e = rulegraph.explain(module, "gi", text=TEXT, tokenizer=tokenizer, dtype=torch.float64)
    exported = rulegraph.explain(bert_onnx, "gi", text=TEXT, dtype=torch.float64)
    torch.testing.assert_close(e.relevance["input_ids"], exported.relevance["input_ids"], rtol=0, atol=1e-5)
    assert e.labels == ["negative", "positive"] and module.training is False
    first = rulegraph.load(module)
    assert rulegraph.load(module) is first                                # captured once while the weights hold
    with torch.no_grad():
        next(module.parameters()).add_(0.0)
    assert rulegraph.load(module) is not first                            # changed in place: captured again
