"""Many targets from one forward (passes.base.apply_targets): one walk per target on the shared
forward values equals the one-target explanation of each, bit for bit, audit included, for every
shipped rule set on a classifier and a language model's top-K next tokens."""
from __future__ import annotations

import pytest
import torch

import rulegraph
import tiny
from rulegraph.errors import InputError
from rulegraph.passes import apply, apply_targets
from rulegraph.passes.base import MAX_TARGETS, target_sets

RULE_SETS = sorted(rulegraph.shipped_rule_sets())


def _same(a, b):
    assert a.target == b.target and a.output_value == b.output_value
    for key in a.boundary:
        assert torch.equal(a.boundary[key], b.boundary[key]), key
    if a.audit is not None:
        assert a.audit.conservation == b.audit.conservation


@pytest.mark.parametrize("rules", RULE_SETS)
def test_every_class_from_one_forward_equals_one_class_at_a_time(bert_onnx, rules):
    feeds = tiny.token_inputs(batch=2, length=7)
    many = apply_targets(bert_onnx, rules, feeds, "all", dtype=torch.float64)
    classes = many[0].output_tensor.shape[-1]
    assert classes >= 2 and [e.target for e in many] == [[c, c] for c in range(classes)]
    for c, e in enumerate(many):
        _same(e, apply(bert_onnx, rules, feeds, c, dtype=torch.float64))


def test_top_k_next_tokens_of_a_language_model(causal_lm):
    _, path = causal_lm
    ids = torch.tensor([tiny.lm_tokenizer().encode("w1 w2 w3 w4").ids])
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    many = apply_targets(path, "attnlrp", feeds, "top-3", dtype=torch.float64, score="logprob")
    logits = many[0].output_tensor[0, -1]
    assert [e.target[0] for e in many] == logits.topk(3).indices.tolist()
    for e in many:
        _same(e, apply(path, "attnlrp", feeds, e.target[0], dtype=torch.float64, score="logprob"))


@pytest.mark.parametrize("spec, message", [
    ("top-0", "'top-K' with K in 1…3"), ("top-4", "'top-K' with K in 1…3"), ("best", "targets must be 'all'"),
    ([], "non-empty list"), ([0, 3], "target 3 is out of range; the output has 3 classes"),
    ([True], "non-empty list of class indices"),
])
def test_bad_target_specs_name_the_choices(spec, message):
    """(a [1, 3] output)"""
    with pytest.raises(InputError, match=message):
        target_sets(torch.zeros(1, 3), spec, None)


def test_all_is_bounded():
    with pytest.raises(InputError, match=f"would explain {MAX_TARGETS + 1} classes; the limit is {MAX_TARGETS}"):
        target_sets(torch.zeros(1, MAX_TARGETS + 1), "all", None)
