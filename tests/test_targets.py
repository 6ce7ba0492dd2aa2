"""Targets beyond one class logit, on a GPT-2 LM head export ([batch, positions, vocab]): a
contrast (z_A − z_B) and a log-probability (z_A − Σ p·z, p held constant), in the API and the CLI."""
from __future__ import annotations

import json

import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main

A, B, POSITION = 10, 12, 3       # w5, w7


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """The tiny GPT-2 LM head (float64 copy for autograd) and its export, tokenizer.json beside it."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tiny.VOCAB), n_embd=32, n_layer=2, n_head=4, n_positions=64,
                        attn_implementation="eager")
    module = GPT2LMHeadModel(config).eval()
    folder = tmp_path_factory.mktemp("lm")
    path = tiny.onnx(module, folder / "lm.onnx", names=("input_ids", "attention_mask"))
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    return module.double(), path


def feeds():
    return tiny.token_inputs(("input_ids", "attention_mask"), length=6)


def run(path, rules, **kw):
    return rulegraph.explain(path, rules, feeds(), dtype=torch.float64, position=POSITION, **kw)


@pytest.mark.parametrize("rules", ["gi", "lrp-ah-ln"])
def test_contrast_is_the_difference_of_the_two_explanations(lm, rules):
    _, path = lm
    a, b = run(path, rules, target=A), run(path, rules, target=B)
    c = run(path, rules, target=A, contrast=B)
    assert c.target == [A] and c.contrast == [B] and c.score == "logit"
    diff = a.boundary["input_ids"] - b.boundary["input_ids"]
    assert (c.boundary["input_ids"] - diff).abs().max() < 1e-10
    logits = c.output_tensor[0, POSITION].double()
    assert c.output_value[0] == pytest.approx(float(logits[A] - logits[B]), abs=1e-12)
    assert c.audit.conservation.residual == pytest.approx(0, abs=1e-10)
    d = c.to_dict()
    assert (d["target"], d["contrast"], d["score"]) == (A, B, "logit")


@pytest.mark.parametrize("rules", ["gi", "lrp-ah-ln"])
def test_logprob_conserves_to_its_linear_scalar(lm, rules):
    _, path = lm
    e = run(path, rules, target=A, score="logprob")
    z = e.output_tensor[0, POSITION].double()
    p = z.softmax(-1)
    assert e.output_value[0] == pytest.approx(float(z[A] - (p * z).sum()), abs=1e-12)
    assert e.extra["logprob"][0] == pytest.approx(float(z.log_softmax(-1)[A]), abs=1e-12)
    # the explained value is log p_A plus the entropy of p
    assert e.output_value[0] == pytest.approx(e.extra["logprob"][0] - float((p * p.log()).sum()), abs=1e-12)
    assert abs(e.audit.conservation.residual) < 1e-10
    d = e.to_dict()
    assert d["score"] == "logprob" and d["contrast"] is None and d["logprob"] == e.extra["logprob"][0]


@pytest.mark.parametrize("rules", ["gi", "lrp-ah-ln"])
def test_logprob_contrast_is_the_logit_contrast(lm, rules):
    _, path = lm
    c = run(path, rules, target=A, contrast=B)
    lp = run(path, rules, target=A, contrast=B, score="logprob")
    assert torch.equal(lp.boundary["input_ids"], c.boundary["input_ids"])
    z = lp.output_tensor[0, POSITION].double().log_softmax(-1)
    assert lp.extra["logprob"][0] == pytest.approx(float(z[A] - z[B]), abs=1e-12)
    assert lp.extra["logprob"][0] == pytest.approx(lp.output_value[0], abs=1e-10)
    assert abs(lp.audit.conservation.residual) < 1e-10


def test_logprob_under_gi_is_autograd_input_times_gradient(lm):
    """gi with the logprob seed: x ⊙ ∂(z_A − Σ p_j z_j)/∂x with p detached, at the token embeddings —
    which is also x ⊙ ∂ log p_A/∂x."""
    module, path = lm
    e = run(path, "gi", target=A, score="logprob")
    f = feeds()
    x = module.transformer.wte(f["input_ids"]).detach().requires_grad_()
    z = module(inputs_embeds=x, attention_mask=f["attention_mask"]).logits[0, POSITION]
    p = z.softmax(-1).detach()
    (grad,) = torch.autograd.grad(z[A] - (p * z).sum(), x, retain_graph=True)
    (grad_logp,) = torch.autograd.grad(z.log_softmax(-1)[A], x)
    assert (grad - grad_logp).abs().max() < 1e-12
    assert (e.boundary["input_ids"] - x.detach() * grad).abs().max() < 1e-10


def test_default_target_is_unchanged(lm):
    _, path = lm
    plain = run(path, "lrp-ah-ln")
    assert plain.contrast is None and plain.score == "logit" and "logprob" not in plain.extra
    d = plain.to_dict()
    assert "contrast" not in d and "score" not in d


def test_cli_target_and_contrast_as_token_text(lm, tmp_path, capsys):
    _, path = lm
    out = tmp_path / "e.json"
    code = main(["explain", str(path), "-r", "gi", "-t", "w1 w2 w3 w4", "--target", " w5", "--contrast", " w7",
                 "--position", "2", "--dtype", "float64", "--json", str(out)])
    assert code in (0, None), capsys.readouterr().err
    d = json.loads(out.read_text())
    assert (d["target"], d["contrast"], d["score"], d["position"]) == (A, B, "logit", 2)
    ids = torch.tensor([[2, 6, 7, 8, 9, 3]])         # [CLS] w1 w2 w3 w4 [SEP]
    e = rulegraph.explain(path, "gi", {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, A, contrast=B,
                          position=2, dtype=torch.float64)
    assert d["output_value"] == pytest.approx(e.output_value[0], abs=1e-12)
    assert d["relevance"]["input_ids"] == pytest.approx(e.scores(), abs=1e-12)
    capsys.readouterr()
    code = main(["explain", str(path), "-r", "lrp-ah-ln", "-t", "w1 w2", "--target", str(A), "--score", "logprob",
                 "--json", "-"])
    d = json.loads(capsys.readouterr().out)
    assert code in (0, None) and d["score"] == "logprob" and d["contrast"] is None and "logprob" in d


def test_methods_take_contrast_beside_a_method_score_option(lm):
    from rulegraph.methods import explain_with
    _, path = lm
    e = explain_with(path, "gi", feeds(), A, contrast=B, target_score="logprob", position=POSITION,
                     dtype=torch.float64)
    c = run(path, "gi", target=A, contrast=B)
    assert torch.equal(e.boundary["input_ids"], c.boundary["input_ids"]) and e.score == "logprob"
    with pytest.raises(rulegraph.errors.InputError, match="loo is a baseline"):
        explain_with(path, "loo", feeds(), A, contrast=B, position=POSITION, mode="delete")


def test_one_position_per_batch_item_equals_separate_explanations(lm):
    """``position=[p0, p1]``: each batch item explained at its own position (rulegraph.generate batches
    the steps of a generation this way)."""
    _, path = lm
    one = feeds()
    two = {k: v.repeat(2, 1) for k, v in one.items()}
    both = rulegraph.explain(path, "lrp-ah-ln", two, [A, B], position=[2, 4], dtype=torch.float64)
    assert both.position == [2, 4] and both.target == [A, B]
    for i, (target, position) in enumerate(((A, 2), (B, 4))):
        single = rulegraph.explain(path, "lrp-ah-ln", one, target, position=position, dtype=torch.float64)
        assert (both.relevance["input_ids"][i] - single.relevance["input_ids"][0]).abs().max() < 1e-12
        assert both.output_value[i] == pytest.approx(single.output_value[0], abs=1e-12)
    with pytest.raises(rulegraph.RulegraphError, match="got 3 positions for a batch of 2"):
        rulegraph.explain(path, "gi", two, position=[1, 2, 3])
    with pytest.raises(rulegraph.RulegraphError, match="position 9 is out of range"):
        rulegraph.explain(path, "gi", two, position=[1, 9])


# -- objective= : a linear expression of logits and log-probabilities (rulegraph.objective) ------------------

@pytest.mark.parametrize("rules", ["gi", "lrp-ah-ln", "attnlrp"])
def test_objective_is_the_weighted_sum_of_single_target_explanations(lm, rules):
    """Relevance is linear in the seed, so 2·logit[A] − 0.5·logit[B] is 2·R(A) − 0.5·R(B), node for node."""
    _, path = lm
    e = run(path, rules, objective=f"2 * logit[{A}] - 0.5*logit[{B}]")
    a, b = run(path, rules, target=A), run(path, rules, target=B)
    expected = 2 * a.relevance["input_ids"] - 0.5 * b.relevance["input_ids"]
    assert (e.relevance["input_ids"] - expected).abs().max() < 1e-10
    assert e.output_value[0] == pytest.approx(2 * a.output_value[0] - 0.5 * b.output_value[0], abs=1e-10)
    assert e.extra["objective_value"][0] == pytest.approx(e.output_value[0], abs=1e-10)   # logits only: exact
    c = e.audit.conservation
    assert abs(c.residual) <= 1e-9 * max(1.0, abs(c.output_value))


def test_objective_logprob_terms_are_the_gradient_with_p_held_constant(lm):
    """logprob[A] + logprob[B]: the seed is ∂(log p_A + log p_B)/∂z (autograd on the logits), `gi`
    equals autograd x·∂/∂x of the expression on the module, and the value is log p_A + log p_B."""
    module, path = lm
    e = run(path, "gi", objective=f"logprob[{A}] + logprob[{B}]")
    f = feeds()
    embeddings = module.transformer.wte(f["input_ids"]).detach().requires_grad_(True)
    logits = module(inputs_embeds=embeddings, attention_mask=f["attention_mask"]).logits[0, POSITION]
    logp = logits.log_softmax(-1)
    (logp[A] + logp[B]).backward()
    reference = (embeddings * embeddings.grad).sum(-1)[0]
    assert torch.allclose(e.relevance["input_ids"][0], reference.detach(), rtol=1e-8, atol=1e-10)
    assert e.extra["objective_value"][0] == pytest.approx(float(logp[A] + logp[B]), rel=1e-9)
    single = run(path, "lrp-ah-ln", target=A, score="logprob")
    same = run(path, "lrp-ah-ln", objective=f"logprob[{A}]")
    assert (single.relevance["input_ids"] - same.relevance["input_ids"]).abs().max() < 1e-12


def test_cli_objective_with_token_text(lm, tmp_path, capsys):
    _, path = lm
    out = tmp_path / "e.json"
    code = main(["explain", str(path), "-r", "gi", "-t", "w1 w2 w3 w4", "--objective",
                 "logprob[\" w5\"] - logprob[' w7']", "--position", "2", "--dtype", "float64", "--json", str(out)])
    assert code in (0, None), capsys.readouterr().err
    d = json.loads(out.read_text())
    ids = torch.tensor([[2, 6, 7, 8, 9, 3]])         # [CLS] w1 w2 w3 w4 [SEP]
    e = rulegraph.explain(path, "gi", {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, A, contrast=B,
                          position=2, dtype=torch.float64)
    assert d["objective"] == "logprob[\" w5\"] - logprob[' w7']"
    assert d["relevance"]["input_ids"] == pytest.approx(e.scores(), abs=1e-12)     # log p_A − log p_B = z_A − z_B
    assert d["objective_value"] == pytest.approx(e.output_value[0], abs=1e-10)


@pytest.mark.parametrize("args, message", [
    (["--objective", "logit[10]", "--target", "3"], "give an objective, or target / contrast / score, not both"),
    (["--objective", "logits[10]"], "unknown term 'logits' at column 1; valid: logit, logprob"),
    (["--objective", "logit[10] logit[3]"], "cannot read column 11"),
    (["--objective", "logit[99999]"], "id 99999 is out of range"),
    (["--objective", "logit[\" w5 w7\"]"], "is 2 tokens"),
    (["-m", "loo", "--objective", "logit[10]"], "objective are supported by rule sets; loo is a baseline"),
])
def test_cli_bad_objective_is_one_line(lm, capsys, args, message):
    _, path = lm
    rules = [] if "-m" in args else ["-r", "gi"]
    assert main(["explain", str(path), *rules, "-t", "w1 w2", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
