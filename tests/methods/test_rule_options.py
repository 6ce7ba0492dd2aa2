"""What a rule set explains, as method options (``rulegraph evaluate -o NAME.score=logprob``,
``NAME.contrast=runner-up``): the same explanations as the API's ``score=`` / ``contrast=`` with the class
given by hand, and one method under another name (``LABEL=METHOD``)."""
from __future__ import annotations

import pytest
import torch

import rulegraph
from rulegraph.errors import InputError
from rulegraph.methods import explain_with, get

IDS = torch.tensor([[7, 31, 12, 55, 40, 9], [3, 18, 60, 22, 5, 71]])


def inputs():
    return {"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}


@pytest.mark.parametrize("rules", ["epsilon", "attnlrp"])
def test_score_and_runner_up_contrast_as_options(causal_lm, rules):
    _, path = causal_lm
    graph = rulegraph.load(path)
    with torch.no_grad():
        last = rulegraph.explain(graph, rules, inputs(), dtype=torch.float64).output_tensor[:, -1]
    top2 = last.topk(2, -1).indices
    by_hand = rulegraph.explain(graph, rules, inputs(), dtype=torch.float64, contrast=top2[:, 1].tolist())
    option = explain_with(path, rules, inputs(), dtype=torch.float64, contrast="runner-up")
    assert option.contrast == top2[:, 1].tolist() and option.target == top2[:, 0].tolist()
    assert option.scores("input_ids") == by_hand.scores("input_ids")
    api = rulegraph.explain(graph, rules, inputs(), dtype=torch.float64, score="logprob")
    via = explain_with(path, rules, inputs(), dtype=torch.float64, score="logprob")
    assert via.scores("input_ids") == api.scores("input_ids")
    assert via.extra["logprob"] == api.extra["logprob"]
    # the API's arguments win over the options where both are given
    both = explain_with(path, rules, inputs(), dtype=torch.float64, score="logprob", target_score="logit",
                        contrast=top2[:, 1].tolist())
    assert both.scores("input_ids") == by_hand.scores("input_ids")


def test_a_target_with_a_runner_up_contrast_subtracts_the_best_other_class(causal_lm):
    _, path = causal_lm
    e = rulegraph.explain(path, "gi", inputs(), target=5, contrast="runner-up")
    logits = e.output_tensor[:, -1].clone()
    logits[:, 5] = -torch.inf
    assert e.contrast == logits.argmax(-1).tolist()
    with pytest.raises(InputError, match="contrast 'second' is not in the tokenizer's vocabulary"):
        rulegraph.explain(path, "gi", inputs(), contrast="second")      # text other than runner-up: a token


def test_a_method_under_another_name():
    m = get("lp=lrp-ah-ln")
    assert m.name == "lp" and m.rule_set and {o.name for o in m.options} >= {"score", "contrast"}
    assert m.units({"score": "logprob"}) == "relevance of log p (p held)"
    assert get("lrp-ah-ln").units({"contrast": "runner-up"}) == "relevance of z − z(runner-up)"
    with pytest.raises(InputError, match="already a method's name"):
        get("gi=lrp-ah-ln")
    with pytest.raises(InputError, match="LABEL=METHOD"):
        get("=lrp-ah-ln")
    with pytest.raises(InputError, match="unknown method 'lrp-ahx'"):
        get("x=lrp-ahx")
    with pytest.raises(InputError, match="contrast, score='logprob' and objective are supported by rule sets"):
        explain_with("unused.onnx", "ig", inputs(), contrast="runner-up")


def test_a_labelled_rule_set_takes_the_text_s_words_as_its_own_name_does(bert_onnx):
    """``LABEL=METHOD`` has its method's options (groups=word reads the words of the text), not a rule set
    looked up by its label."""
    labelled = rulegraph.explain(bert_onnx, "dw=decomposition", text="w1 w2 w3", groups="word")
    plain = rulegraph.explain(bert_onnx, "decomposition", text="w1 w2 w3", groups="word")
    assert labelled.method == "dw" and plain.method == "decomposition"
    assert labelled.relevance.keys() == plain.relevance.keys()
    assert all(torch.equal(labelled.relevance[k], plain.relevance[k]) for k in plain.relevance)
