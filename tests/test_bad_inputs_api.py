"""A corpus of bad arguments to the Python API: each raises a :class:`RulegraphError` subclass
with a message naming the problem, before any work, and never another exception type."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import rulegraph
import tiny
from rulegraph.errors import InputError, ModelError, RuleFileError, RulegraphError, RuleMatchError


def feeds(**changes):
    f = tiny.token_inputs()
    f.update(changes)
    return f


CASES = [
    ("inputs-tensor", dict(inputs=torch.ones(1, 3, dtype=torch.long)), InputError, "inputs must be a dict"),
    ("inputs-list", dict(inputs=[[1, 2]]), InputError, "inputs must be a dict"),
    ("inputs-int-key", dict(inputs={0: torch.ones(1, 3)}), InputError, "keyed by input name"),
    ("inputs-missing", dict(inputs={"input_ids": torch.tensor([[2, 5, 3]])}), InputError, "missing input(s)"),
    ("inputs-unknown", dict(inputs=feeds(extra=torch.ones(1))), InputError, "unknown input(s) extra"),
    ("inputs-strings", dict(inputs=feeds(input_ids=[["a", "b"]])), InputError, "must be a tensor or an array"),
    ("inputs-float-ids", dict(inputs=feeds(input_ids=torch.ones(1, 9))), InputError, "input input_ids must be int64"),
    ("inputs-rank", dict(inputs=feeds(input_ids=torch.ones(9, dtype=torch.long))), InputError, "must have 2 dims"),
    ("inputs-negative", dict(inputs=feeds(input_ids=torch.full((1, 9), -3))), InputError, "holds the id -3"),
    ("inputs-oov", dict(inputs=feeds(input_ids=torch.full((1, 9), 1000))), InputError, "outside the vocabulary"),
    ("inputs-too-long", dict(inputs=tiny.token_inputs(length=80)), InputError, "takes at most 64"),
    ("inputs-mask-length", dict(inputs=feeds(attention_mask=torch.ones(1, 4, dtype=torch.long))), InputError,
     "has 4 along 'sequence'"),
    ("inputs-batch", dict(inputs=feeds(attention_mask=torch.ones(2, 9, dtype=torch.long))), InputError,
     "has 2 along 'batch'"),
    ("inputs-numpy-object", dict(inputs=feeds(input_ids=np.array([[{}]], dtype=object))), InputError,
     "must be a tensor or an array"),
    ("target-str", dict(target="great"), InputError, "target 'great' is not a class of this model; its classes: negative, positive"),
    ("target-float", dict(target=1.0), InputError, "target must be a class index"),
    ("target-bool", dict(target=True), InputError, "target must be a class index"),
    ("target-range", dict(target=2), InputError, "target 2 is out of range"),
    ("target-negative", dict(target=-1), InputError, "target -1 is out of range"),
    ("target-batch", dict(target=[0, 1]), InputError, "got 2 targets for a batch of 1"),
    ("contrast-str", dict(target=0, contrast="bad"), InputError, "contrast 'bad' is not a class of this model"),
    ("contrast-float", dict(target=0, contrast=1.0), InputError, "contrast must be a class index"),
    ("contrast-range", dict(target=0, contrast=2), InputError, "contrast 2 is out of range"),
    ("contrast-negative", dict(target=0, contrast=-1), InputError, "contrast -1 is out of range"),
    ("contrast-is-target", dict(target=1, contrast=1), InputError, "contrast 1 is the target itself"),
    ("contrast-batch", dict(target=0, contrast=[1, 0]), InputError, "got 2 contrast classes for a batch of 1"),
    ("score-unknown", dict(score="prob"), InputError, "score must be one of logit, logprob, probability"),
    ("score-not-str", dict(score=1), InputError, "score must be one of logit, logprob, probability"),
    ("position-classifier", dict(position=1), InputError, "has no positions"),
    ("position-float", dict(position=0.5), InputError, "position must be an int"),
    ("output-unknown", dict(output="probs"), InputError, "no value named 'probs' in the graph"),
    ("device-unknown", dict(device="gpu"), InputError, "unknown device 'gpu'"),
    ("device-unsupported", dict(device="meta"), InputError, "device 'meta' is not supported"),
    ("dtype-int", dict(dtype=torch.int32), InputError, "dtype must be one of float32, float64, bfloat16, float16"),
    ("pass-option", dict(groups="word"), InputError, "method 'lrp-ah-ln' has no option 'groups'; valid: at, compiled, condition, contrast, graph, logits, record, replay, score"),
    ("text-and-inputs", dict(text="w1 w2"), InputError, "give inputs or text"),
    ("text-not-str", dict(inputs=None, text=b"w1"), InputError, "text must be a str"),
    ("no-inputs", dict(inputs=None), InputError, "give the model's inputs"),
    ("rules-unknown", dict(rules="lrp-ahh"), InputError, "unknown method 'lrp-ahh'; did you mean 'lrp-ah' or 'lrp-ah-ln'"),
    ("rules-missing", dict(rules="none.yaml"), RuleFileError, "rule file not found"),
    ("model-missing", dict(model="none.onnx"), ModelError, "model file not found"),
    ("model-object", dict(model=object()), ModelError, "cannot load a object"),
    ("decomposition-mode", dict(rules="decomposition", mode="fast"), InputError,
     "option decomposition.mode: 'fast' is not valid; valid: auto, components, linearized"),
    ("decomposition-groups", dict(rules="decomposition", groups="sentences"), InputError, "sentences"),
    ("decomposition-linearized-abs", dict(rules="decomposition", mode="linearized", alpha="abs"), InputError,
     "the linearized pass needs signed α"),
]


@pytest.mark.parametrize("arguments, error, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_api_arguments_are_refused(arguments, error, message, bert_onnx):
    call = dict(model=bert_onnx, rules="lrp-ah-ln", inputs=tiny.token_inputs())
    call.update(arguments)
    with pytest.raises(RulegraphError) as info:
        rulegraph.explain(call.pop("model"), call.pop("rules"), call.pop("inputs"), **call)
    assert isinstance(info.value, error), repr(info.value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_rule_match_errors_name_the_line(bert_onnx):
    rules = rulegraph.RuleSet.from_yaml("rules:\n  - op: MatMul\n    rule: ln\n  - op: '*'\n    rule: gradient\n",
                                        source="m.yaml")
    with pytest.raises(RuleMatchError, match=r"m.yaml:2: rule 'ln' cannot apply to node"):
        rulegraph.explain(bert_onnx, rules, tiny.token_inputs())
