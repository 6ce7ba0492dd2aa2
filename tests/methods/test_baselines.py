"""Each baseline against an independent reference computed on the tiny torch BERT with autograd
(or plain re-runs / numpy), in float64."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rulegraph.errors import InputError, RuleFileError, RulegraphError
from rulegraph.methods import Vocab, explain_with, get, names
from rulegraph.ruleset import shipped_rule_sets

VOCAB = Vocab(pad=0, unk=4, mask=None)
IDS = torch.tensor([[2, 11, 17, 23, 31, 42, 55, 3], [2, 60, 71, 88, 93, 19, 3, 0]])
MASK = torch.tensor([[1] * 8, [1] * 7 + [0]])


def feeds():
    return {"input_ids": IDS, "attention_mask": MASK, "token_type_ids": torch.zeros_like(IDS)}


def special():
    s = torch.zeros_like(IDS, dtype=torch.bool)
    s[:, 0] = True
    s[0, 7] = s[1, 6] = True
    return s


@pytest.fixture(scope="module")
def model(bert):
    return bert.double()


def run(bert_onnx, method, **options):
    return explain_with(bert_onnx, method, feeds(), dtype=torch.float64, special=special(), vocab=VOCAB, **options)


def embeddings_hook(model, replace=None):
    """Capture (or replace) the word-embedding output, as a leaf that collects its gradient."""
    store = {}

    def hook(module, args, out):
        x = (replace(out) if replace else out).detach().requires_grad_(True)
        store["x"] = x
        return x
    return store, model.bert.embeddings.word_embeddings.register_forward_hook(hook)


def logits(model, ids=IDS, mask=MASK):
    return model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).logits


def target_sum(out, targets):
    return out[torch.arange(len(targets)), torch.tensor(targets)].sum()


def test_gradient_sensitivity_is_the_norm_of_the_autograd_gradient(model, bert_onnx):
    e = run(bert_onnx, "gs")
    store, handle = embeddings_hook(model)
    try:
        target_sum(logits(model), e.target).backward()
    finally:
        handle.remove()
    expected = store["x"].grad.norm(dim=-1) * MASK
    assert torch.allclose(e.relevance["input_ids"].double() * MASK, expected, rtol=1e-6, atol=1e-9)


def test_gradient_times_input_is_x_dot_gradient(model, bert_onnx):
    e = run(bert_onnx, "gi")
    store, handle = embeddings_hook(model)
    try:
        target_sum(logits(model), e.target).backward()
    finally:
        handle.remove()
    expected = (store["x"] * store["x"].grad).sum(-1) * MASK
    assert torch.allclose(e.relevance["input_ids"].double() * MASK, expected, rtol=1e-6, atol=1e-9)


def test_integrated_gradients_matches_a_riemann_sum_with_autograd(model, bert_onnx):
    e = run(bert_onnx, "ig", steps=24, baseline="pad")
    with torch.no_grad():
        x = model.bert.embeddings.word_embeddings(IDS)
        base_ids = torch.where(special() | (MASK == 0), IDS, torch.zeros_like(IDS))
        base = model.bert.embeddings.word_embeddings(base_ids)
    m = 200
    total = torch.zeros_like(x)
    for a in (torch.arange(m, dtype=torch.float64) + 0.5) / m:           # midpoint rule
        store, handle = embeddings_hook(model, lambda out, a=a: base + a * (x - base))
        try:
            target_sum(logits(model), e.target).backward()
        finally:
            handle.remove()
        total += store["x"].grad / m
    expected = ((x - base) * total).sum(-1) * MASK
    got = e.relevance["input_ids"].double() * MASK
    assert torch.allclose(got, expected, atol=1e-5 * expected.abs().max())
    # completeness: Σ attributions = f(x) − f(x′), up to the quadrature error
    assert max(abs(g) for g in e.extra["completeness_gap"]) < 1e-6


def test_leave_one_out_matches_explicit_reruns(model, bert_onnx):
    e = run(bert_onnx, "loo")           # mode mask: the tiny vocabulary has no [MASK], so [UNK]
    with torch.no_grad():
        full = logits(model)
        for b in range(2):
            n = int(MASK[b].sum())
            for i in range(n):
                got = float(e.relevance["input_ids"][b, i])
                if special()[b, i]:
                    assert got == 0
                    continue
                ids = IDS[b:b + 1, :n].clone()
                ids[0, i] = VOCAB.unk
                changed = logits(model, ids, torch.ones_like(ids))
                expected = float(full[b, e.target[b]] - changed[0, e.target[b]])
                assert got == pytest.approx(expected, abs=1e-9)


def test_leave_one_out_on_onnxruntime_equals_the_interpreter(bert_onnx):
    """The runtimes only run forwards: float32 logits agree to rounding, so the scores do."""
    ours = explain_with(bert_onnx, "loo", feeds(), special=special(), vocab=VOCAB, runtime="rulegraph")
    theirs = explain_with(bert_onnx, "loo", feeds(), special=special(), vocab=VOCAB, runtime="onnxruntime")
    auto = explain_with(bert_onnx, "loo", feeds(), special=special(), vocab=VOCAB)
    assert torch.allclose(ours.relevance["input_ids"], theirs.relevance["input_ids"], atol=1e-5)
    assert torch.equal(auto.relevance["input_ids"], theirs.relevance["input_ids"])
    assert not torch.equal(ours.relevance["input_ids"], torch.zeros_like(ours.relevance["input_ids"]))


def test_the_onnxruntime_runtime_needs_an_onnx_file_in_float32(bert_onnx):
    with pytest.raises(InputError, match="onnxruntime runtime needs"):
        run(bert_onnx, "loo", runtime="onnxruntime")          # float64
    with pytest.raises(InputError, match="loo.runtime: 'ort' is not valid"):
        run(bert_onnx, "loo", runtime="ort")


def test_leave_one_out_delete_mode_shortens_the_sequence(model, bert_onnx):
    e = run(bert_onnx, "loo", mode="delete", drop="prob")
    with torch.no_grad():
        p = logits(model).softmax(-1)
        keep = [j for j in range(8) if j != 3]
        ids = IDS[:1, keep]
        q = logits(model, ids, torch.ones_like(ids)).softmax(-1)
    assert float(e.relevance["input_ids"][0, 3]) == pytest.approx(float(p[0, e.target[0]] - q[0, e.target[0]]),
                                                                 abs=1e-9)


def test_raw_attention_is_the_models_last_block_cls_row(model, bert_onnx):
    e = run(bert_onnx, "attention")
    with torch.no_grad():
        att = model(input_ids=IDS, attention_mask=MASK, token_type_ids=torch.zeros_like(IDS),
                    output_attentions=True).attentions
    expected = att[-1].mean(1)[:, 0, :]
    assert torch.allclose(e.relevance["input_ids"].double(), expected, atol=1e-9)
    first = run(bert_onnx, "attention", block=0)
    assert torch.allclose(first.relevance["input_ids"].double(), att[0].mean(1)[:, 0, :], atol=1e-9)


def rollout_numpy(attentions, residual=0.5):
    """Abnar & Zuidema (2020), written directly: Ã = (1−r)·mean_h A + r·I, rows normalised, product."""
    joint = None
    for a in attentions:
        a = a.mean(axis=1)
        a = (1 - residual) * a + residual * np.eye(a.shape[-1])[None]
        a = a / a.sum(-1, keepdims=True)
        joint = a if joint is None else np.einsum("bij,bjk->bik", a, joint)
    return joint


def test_rollout_matches_a_numpy_implementation(model, bert_onnx):
    e = run(bert_onnx, "rollout")
    with torch.no_grad():
        att = model(input_ids=IDS, attention_mask=MASK, token_type_ids=torch.zeros_like(IDS),
                    output_attentions=True).attentions
    expected = rollout_numpy([a.numpy() for a in att])[:, 0, :]
    np.testing.assert_allclose(e.relevance["input_ids"].double().numpy(), expected, atol=1e-9)
    r = run(bert_onnx, "rollout", residual=0.0)
    np.testing.assert_allclose(r.relevance["input_ids"].double().numpy(),
                               rollout_numpy([a.numpy() for a in att], 0.0)[:, 0, :], atol=1e-9)


def test_random_is_deterministic_per_seed_and_batch_independent(bert_onnx):
    a, b = run(bert_onnx, "random", seed=3), run(bert_onnx, "random", seed=3)
    assert torch.equal(a.relevance["input_ids"], b.relevance["input_ids"])
    c = run(bert_onnx, "random", seed=4)
    assert not torch.equal(a.relevance["input_ids"], c.relevance["input_ids"])
    one = explain_with(bert_onnx, "random", {k: v[1:] for k, v in feeds().items()}, seed=3)
    assert torch.equal(one.relevance["input_ids"][0], a.relevance["input_ids"][1])


def test_every_shipped_rule_set_is_a_method():
    listed = names()
    for name in shipped_rule_sets():
        assert name in listed
        assert get(name).rule_set
    assert {"random", "gs", "ig", "loo", "attention", "rollout", "gi", "lrp-ah", "lrp-ah-ln"} <= set(listed)


def test_a_rule_file_is_a_method(bert_onnx, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(shipped_rule_sets()["gi"].read_text())
    e = explain_with(bert_onnx, str(path), feeds(), special=special(), vocab=VOCAB)
    reference = run(bert_onnx, "gi")
    assert torch.allclose(e.relevance["input_ids"].double(), reference.relevance["input_ids"].double(), atol=1e-5)


def test_bad_methods_and_options_are_one_line_input_errors(bert_onnx, tmp_path):
    with pytest.raises(InputError, match="unknown method 'nope'"):
        get("nope")
    with pytest.raises((InputError, RuleFileError), match="rule file not found"):
        get(str(tmp_path / "missing.yaml"))
    with pytest.raises(InputError, match="has no option 'stepz'"):
        run(bert_onnx, "ig", stepz=3)
    with pytest.raises(InputError, match="must be int"):
        run(bert_onnx, "ig", steps="many")
    with pytest.raises(InputError, match="at least 1"):
        run(bert_onnx, "ig", steps=0)
    with pytest.raises(InputError, match="block 7 does not exist"):
        run(bert_onnx, "attention", block=7)
    with pytest.raises(InputError, match="needs the tokenizer"):
        explain_with(bert_onnx, "loo", feeds())


def test_a_broken_rule_file_fails_with_a_clear_error(bert_onnx, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: broken\nrules: [this is not a rule]\n")
    with pytest.raises(RulegraphError):
        explain_with(bert_onnx, str(path), feeds())


def test_integrated_gradients_on_a_float_graph_input(tmp_path):
    """IG where the boundary is the graph input itself (an image's pixels, a clip's samples): the path's points
    go in as that input (the interpreter refuses an override of an input). Against an autograd midpoint sum on
    a smooth model (a convolution, tanh, a linear head), float64."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Tanh(), torch.nn.Flatten(),
                                 torch.nn.Linear(4 * 4 * 4, 3)).eval()
    x = torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "m.onnx"
    torch.onnx.export(module, (x,), str(path), input_names=["pixel_values"], output_names=["logits"],
                      dynamic_axes={"pixel_values": {0: "batch"}}, dynamo=False)
    e = explain_with(path, "ig", {"pixel_values": x}, dtype=torch.float64, steps=32, baseline="zero")
    reference, xd, m = torch.zeros_like(x, dtype=torch.float64), x.double(), 300
    double = module.double()
    for a in (torch.arange(m, dtype=torch.float64) + 0.5) / m:
        point = (a * xd).requires_grad_(True)
        double(point)[0, e.target[0]].backward()
        reference += point.grad / m
    reference *= xd
    torch.testing.assert_close(e.boundary["pixel_values"], reference, rtol=0, atol=1e-6 * float(reference.abs().max()))
