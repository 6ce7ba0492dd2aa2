"""Explaining generation (rulegraph.generation) on tiny random-weight causal LMs exported by
`rulegraph export` (GPT-2, and Llama style with grouped-query attention and rotary positions):
greedy tokens equal Hugging Face's greedy `generate`; the explanation of step t equals a single
explanation of that token on the prefix, and on the full sequence at its position (the claim
that makes batching the steps valid); every step conserves; `gi` equals autograd Gradient×Input."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import rulegraph
import tiny
from rulegraph.errors import InputError
from rulegraph.methods import names as method_names

PROMPT = "w1 w2 w3 w4 w5"
N = 4


def _prompt_ids() -> list[int]:
    return tiny.lm_tokenizer().encode(PROMPT).ids


def test_greedy_tokens_equal_hugging_face_generate(causal_lm):
    module, path = causal_lm
    g = rulegraph.generate(path, "lrp-ah-ln", text=PROMPT, max_new_tokens=6)
    ids = torch.tensor([_prompt_ids()])
    with torch.no_grad():
        expected = module.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                   pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert [s.token for s in g.steps] == expected
    assert [r.strip() for r in g.rows] == [tiny.VOCAB[i] for i in _prompt_ids() + expected[:-1]]
    assert g.groups == ["prompt"] * 5 + ["generated"] * 5
    assert [s.position for s in g.steps] == list(range(4, 10))


@pytest.mark.parametrize("rules", ["gi", "lrp-ah-ln", "attnlrp"])
def test_step_equals_a_single_explanation_on_the_prefix_and_on_the_full_sequence(causal_lm, rules):
    _, path = causal_lm
    g = rulegraph.generate(path, rules, text=PROMPT, max_new_tokens=N, dtype=torch.float64)
    full = torch.tensor([_prompt_ids() + [s.token for s in g.steps][:-1]])
    for s in g.steps:
        prefix = full[:, :s.position + 1]
        one = rulegraph.explain(path, rules, {"input_ids": prefix, "attention_mask": torch.ones_like(prefix)},
                                target=s.token, dtype=torch.float64)
        assert one.output_value[0] == pytest.approx(s.output_value, abs=1e-12)
        torch.testing.assert_close(torch.tensor(s.scores, dtype=torch.float64), one.relevance["input_ids"][0].double(),
                                   rtol=0, atol=1e-12)
        # causal: on the full sequence at the same position, the same scores, and nothing after it
        whole = rulegraph.explain(path, rules, {"input_ids": full, "attention_mask": torch.ones_like(full)},
                                  target=s.token, position=s.position, dtype=torch.float64)
        r = whole.relevance["input_ids"][0].double()
        assert (r[:s.position + 1] - one.relevance["input_ids"][0].double()).abs().max() < 1e-10
        assert float(r[s.position + 1:].abs().sum()) < 1e-12
    # the batched continuation (all steps of the full sequence, 3 per call) gives the same matrix
    batched = rulegraph.generate(path, rules, text=PROMPT, continuation=[s.token for s in g.steps], batch=3,
                                 dtype=torch.float64)
    assert [s.batched for s in batched.steps] == [3, 3, 3, 1]
    diff = (batched.matrix - g.matrix).nan_to_num()
    assert diff.abs().max() < 1e-10
    assert torch.equal(batched.matrix.isnan(), g.matrix.isnan())
    # by default every step from one forward and one walk, each step with its own audit
    together = rulegraph.generate(path, rules, text=PROMPT, continuation=[s.token for s in g.steps],
                                  dtype=torch.float64)
    assert [s.batched for s in together.steps] == [len(g.steps)] * len(g.steps)
    assert (together.matrix - g.matrix).nan_to_num().abs().max() < 1e-10
    assert all(s.relative_error < 1e-10 for s in together.steps)


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
def test_every_step_conserves(causal_lm, rules):
    _, path = causal_lm
    g = rulegraph.generate(path, rules, text=PROMPT, max_new_tokens=3, dtype=torch.float64)
    assert len(g.steps) == 3
    for s in g.steps:
        assert s.relative_error < 1e-10, (s.position, s.residual)
        assert all(math.isfinite(x) for x in s.scores)


def test_gi_equals_autograd_gradient_times_input(causal_lm):
    module, path = causal_lm
    g = rulegraph.generate(path, "gi", text=PROMPT, max_new_tokens=N, dtype=torch.float64)
    model = copy.deepcopy(module).double()
    full = torch.tensor([_prompt_ids() + [s.token for s in g.steps][:-1]])
    for s in g.steps:
        ids = full[:, :s.position + 1]
        x = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        model(inputs_embeds=x, attention_mask=torch.ones_like(ids)).logits[0, -1, s.token].backward()
        reference = (x * x.grad).sum(-1)[0].detach()
        # the export holds float32 constants (rotary frequencies, ε): to ~1e-6 of the largest score
        torch.testing.assert_close(torch.tensor(s.scores, dtype=torch.float64), reference, rtol=1e-5,
                                   atol=1e-6 * float(reference.abs().max()))


def test_a_baseline_method_and_the_json_matrix(causal_lm):
    _, path = causal_lm
    g = rulegraph.generate(path, "ig", text=PROMPT, max_new_tokens=2, steps=4)
    assert g.method == "ig" and len(g.steps) == 2 and g.steps[0].residual is None
    d = g.to_dict()
    assert d["columns"] == g.columns and len(d["matrix"]) == 6 and d["matrix"][5][0] is None
    assert d["matrix"][5][1] == pytest.approx(g.steps[1].scores[5])


def test_logprob_steps(causal_lm):
    _, path = causal_lm
    g = rulegraph.generate(path, "lrp-ah-ln", text=PROMPT, max_new_tokens=2, score="logprob", dtype=torch.float64)
    assert all(s.logprob is not None and s.logprob < 0 for s in g.steps)
    assert all(s.relative_error < 1e-10 for s in g.steps)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_new_tokens=0), "must be an integer ≥ 1"),
    (dict(max_new_tokens=2, continuation="w1"), "not both"),
    (dict(), "give max_new_tokens=N"),
    (dict(max_new_tokens=61), "the prompt has 5 tokens and 61 generated tokens need 65 positions; the model takes at most 64"),
    (dict(max_new_tokens=2, batch=0), "batch must be an integer ≥ 1"),
    (dict(continuation=[5, 500]), "token id 500 is outside the model's vocabulary"),
])
def test_bad_arguments_are_refused(causal_lm, kwargs, message):
    _, path = causal_lm
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rulegraph.generate(path, "gi", text=PROMPT, **kwargs)


def test_a_classifier_is_refused(bert_onnx):
    with pytest.raises(InputError, match=r"needs a language model whose output 'logits' is \[batch, positions, vocab\]"):
        rulegraph.generate(bert_onnx, "gi", text="w1 w2", max_new_tokens=2)


def test_a_bidirectional_model_is_refused(tmp_path):
    """A masked LM has [batch, positions, vocab] logits too, but position 0 sees position 1."""
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    module = BertForMaskedLM(BertConfig(vocab_size=len(tiny.VOCAB), hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64))
    path = tiny.onnx(module.eval(), tmp_path / "mlm.onnx")
    tiny.lm_tokenizer().save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(InputError, match="needs a causal model"):
        rulegraph.generate(path, "gi", text=PROMPT, max_new_tokens=2)


def test_greedy_generation_stops_after_the_end_of_sequence_token_unless_told_not_to(causal_lm):
    """With the model's second generated token declared its eos, generation stops at its first
    occurrence (the eos explained too); ignore_eos=True goes on to the number asked for."""
    _, path = causal_lm
    free = rulegraph.generate(path, "gi", text=PROMPT, max_new_tokens=4, ignore_eos=True)
    graph = rulegraph.load(path)
    tokens = [s.token for s in free.steps]
    eos = tokens[1]
    graph.metadata["rulegraph.eos_token_id"] = str(eos)
    stopped = rulegraph.generate(graph, "gi", text=PROMPT, max_new_tokens=4, tokenizer=path.parent / "tokenizer.json")
    assert [s.token for s in stopped.steps] == tokens[:tokens.index(eos) + 1]
    again = rulegraph.generate(graph, "gi", text=PROMPT, max_new_tokens=4, ignore_eos=True,
                               tokenizer=path.parent / "tokenizer.json")
    assert len(again.steps) == 4 and all(0 < s.probability <= 1 for s in again.steps)


@pytest.mark.parametrize("rules", sorted(rulegraph.shipped_rule_sets()))
@pytest.mark.parametrize("score", ["logit", "logprob"])
def test_the_span_in_one_walk_is_the_sum_of_its_steps(causal_lm, rules, score):
    """span=True explains the continuation's summed logits (log-probabilities) in one more walk; the
    rules are linear in the seed, so its scores are the sum of the steps' columns, and it conserves."""
    _, path = causal_lm
    g = rulegraph.generate(path, rules, text=PROMPT, continuation="w7 w8 w9", dtype=torch.float64, score=score,
                           span=True)
    assert g.span.output_value == pytest.approx(sum(s.output_value for s in g.steps), abs=1e-12)
    torch.testing.assert_close(torch.tensor(g.span.scores, dtype=torch.float64), g.matrix.nan_to_num().sum(1),
                               rtol=0, atol=1e-12)
    assert g.span.relative_error < 1e-10
    if score == "logprob":          # the expression itself: Σ log p of the span's tokens
        assert g.span.value == pytest.approx(sum(s.logprob for s in g.steps), abs=1e-12)
    headers, drawn = g.drawn()
    assert headers[-1] == "Σ span" and drawn.shape == (len(g.rows), len(g.steps) + 1)
    assert g.to_dict()["span"]["objective"] == g.span.objective


def test_the_span_of_a_greedy_generation_and_its_refusals(causal_lm):
    _, path = causal_lm
    g = rulegraph.generate(path, "attnlrp", text=PROMPT, max_new_tokens=3, dtype=torch.float64, span=True)
    assert g.span.output_value == pytest.approx(sum(s.output_value for s in g.steps), abs=1e-12)
    assert rulegraph.generate(path, "gi", text=PROMPT, max_new_tokens=2).span is None
    with pytest.raises(InputError, match="span=True explains the tokens as one objective, which rule sets do; ig"):
        rulegraph.generate(path, "ig", text=PROMPT, max_new_tokens=2, span=True)
    with pytest.raises(InputError, match="span must be True or False"):
        rulegraph.generate(path, "gi", text=PROMPT, max_new_tokens=2, span="yes")


#: options given alike to generate and explain (fewer IG steps: the comparison, not the quadrature, is tested)
OPTIONS = {"ig": {"steps": 4}}
CONTINUATION = "w7 w3 w9"


@pytest.mark.parametrize("method", method_names())
def test_every_method_explains_step_k_as_explain_does_on_its_prefix(causal_lm, method):
    """For every registered method, generate's step k equals explain on the text of the prompt and
    the k tokens before it (the same objective, baseline, special tokens and options), in float64;
    greedy steps equal the same tokens given as a continuation. A method that refuses this model
    is refused alike by both."""
    _, path = causal_lm
    options = OPTIONS.get(method, {})
    words = CONTINUATION.split()
    try:
        one = rulegraph.explain(path, method, text=PROMPT, dtype=torch.float64, **options)
    except rulegraph.RulegraphError as refused:
        with pytest.raises(type(refused)) as again:
            rulegraph.generate(path, method, text=PROMPT, max_new_tokens=1, dtype=torch.float64, **options)
        assert str(again.value) == str(refused)
        assert method in {"epsilon-gamma-box", "epsilon-plus-flat", "mask-lrp-random", "mask-lrp-rollout"}, refused
        return
    given = rulegraph.generate(path, method, text=PROMPT, continuation=CONTINUATION, dtype=torch.float64, **options)
    assert [s.text.strip() for s in given.steps] == words
    for k, step in enumerate(given.steps):
        e = rulegraph.explain(path, method, text=" ".join([PROMPT, *words[:k]]), target=step.token,
                              dtype=torch.float64, **options)
        assert step.output_value == pytest.approx(e.output_value[0], abs=1e-12)
        torch.testing.assert_close(torch.tensor(step.scores, dtype=torch.float64),
                                   e.relevance["input_ids"][0].double(), rtol=0, atol=1e-12)
    greedy = rulegraph.generate(path, method, text=PROMPT, max_new_tokens=3, dtype=torch.float64, **options)
    assert greedy.steps[0].token == one.target[0]
    torch.testing.assert_close(torch.tensor(greedy.steps[0].scores, dtype=torch.float64),
                               one.relevance["input_ids"][0].double(), rtol=0, atol=1e-12)
    same = rulegraph.generate(path, method, text=PROMPT, continuation=[s.token for s in greedy.steps],
                              dtype=torch.float64, **options)
    diff = (same.matrix - greedy.matrix).nan_to_num()
    assert float(diff.abs().max()) <= 1e-12 and torch.equal(same.matrix.isnan(), greedy.matrix.isnan())
