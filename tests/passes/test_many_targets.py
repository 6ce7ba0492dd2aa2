"""Many targets from one forward (passes.base.apply_targets; the relevance pass walks them all at once,
passes.relevance.walk_many): equal to the one-target explanation of each — float64 to 1e-12 relative,
the maps, every node's audit figures and the conservation — for every shipped rule set on a classifier
and a language model's top-K next tokens, in one group of targets or several."""
from __future__ import annotations

import pytest
import torch

import rulegraph
import tiny
from targets import same
from rulegraph.errors import InputError
from rulegraph.passes import apply, apply_targets
from rulegraph.passes.base import MAX_TARGETS, target_sets

RULE_SETS = sorted(rulegraph.shipped_rule_sets())


@pytest.mark.parametrize("rules", RULE_SETS)
def test_every_class_from_one_forward_equals_one_class_at_a_time(bert_onnx, rules):
    feeds = tiny.token_inputs(batch=2, length=7)
    many = apply_targets(bert_onnx, rules, feeds, "all", dtype=torch.float64)
    classes = many[0].output_tensor.shape[-1]
    assert classes >= 2 and [e.target for e in many] == [[c, c] for c in range(classes)]
    for c, e in enumerate(many):
        same(e, apply(bert_onnx, rules, feeds, c, dtype=torch.float64))


@pytest.mark.parametrize("kind", ["cnn", "resnet", "mobilenetv3"])
def test_cnns_every_class_in_one_walk(tmp_path, kind):
    """Convolutions, pooling, BatchNorm, Hardswish and the CNN sets' z⁺ / γ / box rules under the batched walk."""
    import cnn
    path = cnn.onnx(cnn.build(kind), tmp_path / "m.onnx", cnn.image(1, 8))
    feeds = {"pixel_values": cnn.image(2, 8)}
    for rules in sorted(rulegraph.shipped_rule_sets("cnns")) + ["gi"]:
        for e in apply_targets(path, rules, feeds, "all", dtype=torch.float64):
            same(e, apply(path, rules, feeds, e.target, dtype=torch.float64))


def test_targets_walked_in_groups_equal_one_group(tmp_path, monkeypatch):
    """More targets than one batched walk may hold (relevance.GROUP) are walked in groups, and relevance too
    large to hold for two targets one target at a time; the same explanations every way."""
    from rulegraph.passes import relevance
    import cnn
    path = cnn.onnx(cnn.build("mlp"), tmp_path / "m.onnx", cnn.image(1, 2)[:, :, :2, :2])
    feeds = {"pixel_values": cnn.image(2, 2)[:, :, :2, :2]}
    whole = apply_targets(path, "gi", feeds, "all", dtype=torch.float64)
    groups: list[int] = []
    walk_group = relevance._walk_group
    monkeypatch.setattr(relevance, "_walk_group", lambda *a, **k: groups.append(len(a[4])) or walk_group(*a, **k))
    # the largest relevance held: the [2, 12] input's (a weight is held once)
    for size, expected in ((1 << 20, [3]), (48, [2, 1]), (47, [])):
        groups.clear()
        monkeypatch.setattr(relevance, "GROUP", size)
        for a, b in zip(apply_targets(path, "gi", feeds, "all", dtype=torch.float64), whole, strict=True):
            same(a, b)
        assert groups == expected, size


def test_many_targets_read_inside_the_model(bert_onnx):
    """``--at`` and a condition under the batched walk: per target, what one target's walk reads."""
    feeds = tiny.token_inputs(batch=1, length=7)
    asked = dict(at="block 1 attention output", condition="block 1 attention output:heads=0")
    many = apply_targets(bert_onnx, "attnlrp", feeds, [1, 0], dtype=torch.float64, **asked)
    for e in many:
        one = apply(bert_onnx, "attnlrp", feeds, e.target[0], dtype=torch.float64, **asked)
        same(e, one)
        (x,), (y,) = e.inside["block 1 attention output"], one.inside["block 1 attention output"]
        torch.testing.assert_close(x.relevance, y.relevance, rtol=0, atol=1e-12 * float(y.relevance.abs().max()))
        assert e.extra["condition"]["absorbed"] == pytest.approx(one.extra["condition"]["absorbed"], abs=1e-12)


def test_top_k_next_tokens_of_a_language_model(causal_lm):
    _, path = causal_lm
    ids = torch.tensor([tiny.lm_tokenizer().encode("w1 w2 w3 w4").ids])
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    many = apply_targets(path, "attnlrp", feeds, "top-3", dtype=torch.float64, score="logprob")
    logits = many[0].output_tensor[0, -1]
    assert [e.target[0] for e in many] == logits.topk(3).indices.tolist()
    for e in many:
        same(e, apply(path, "attnlrp", feeds, e.target[0], dtype=torch.float64, score="logprob"))


@pytest.mark.parametrize("limit", ["ONE_BY_ONE_FROM", "VOCABULARY_FROM"])
def test_a_language_models_logits_are_walked_one_target_at_a_time(causal_lm, monkeypatch, limit):
    """Logits of relevance.ONE_BY_ONE_FROM elements or more (a language model's [positions, vocabulary]), or
    of VOCABULARY_FROM classes (its head computed at the explained positions only): a walk per target on the
    one forward, not a batched one; the explanations are the same."""
    from rulegraph.passes import relevance
    _, path = causal_lm
    ids = torch.tensor([tiny.lm_tokenizer().encode("w1 w2 w3 w4").ids])
    feeds = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    groups: list[int] = []
    walk_group = relevance._walk_group
    monkeypatch.setattr(relevance, "_walk_group", lambda *a, **k: groups.append(len(a[4])) or walk_group(*a, **k))
    batched = apply_targets(path, "attnlrp", feeds, "top-3", dtype=torch.float64, score="logprob")
    assert groups == [3]                # the tiny model's 100 classes at one position: batched by default
    monkeypatch.setattr(relevance, limit, 100 if limit == "VOCABULARY_FROM" else 1)
    for a, b in zip(apply_targets(path, "attnlrp", feeds, "top-3", dtype=torch.float64, score="logprob"), batched,
                    strict=True):
        same(a, b)
    assert groups == [3]


def test_each_target_at_its_own_position(causal_lm):
    """``explain(…, targets=[…], positions=[…])``: (token, position) pairs from one forward and one walk, each
    equal to its own explanation at that position; a baseline is refused."""
    _, path = causal_lm
    text = "w1 w2 w3 w4 w5"
    pairs = [(7, 1), (9, 3), (7, 4)]
    many = rulegraph.explain(path, "attnlrp", text=text, targets=[t for t, _ in pairs],
                             positions=[p for _, p in pairs], dtype=torch.float64)
    for e, (t, p) in zip(many, pairs, strict=True):
        assert e.position == p
        same(e, rulegraph.explain(path, "attnlrp", text=text, target=t, position=p, dtype=torch.float64))
    with pytest.raises(InputError, match="positions=… is a rule set's"):
        rulegraph.explain(path, "ig", text=text, targets=[7], positions=[1])
    with pytest.raises(InputError, match="each of at most 256 targets its position: 1 for"):
        rulegraph.explain(path, "attnlrp", text=text, targets=[7, 9], positions=[1])


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

