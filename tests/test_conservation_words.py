"""The audit in words (rulegraph.audit.Conservation.summary): the shares of the explained value that
the tokens carry, constants absorb, rules break by design and the residual leaves; the flag when the
tokens carry little or the opposite sign; the same sentence in the terminal, the HTML page and JSON."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import rulegraph
from rulegraph.audit import CONSERVE_TO_TOKENS, LITTLE, Conservation
from rulegraph.cli import main
from rulegraph.render.page import explanation_fragment
from rulegraph.rules import shipped_rule_sets
from rulegraph.ruleset import RuleSet
from test_conservation import EPSILON, Z_RULE, random_network

TEXT = "i laughed , i cried"
TRANSFORMER_SETS = ("gi", "lrp-ah", "lrp-ah-ln", "epsilon", "cp-lrp", "attnlrp", "mask-lrp", "decomposition")


@pytest.fixture(scope="module")
def bert_graph(bert_onnx):
    return rulegraph.load(bert_onnx)


def assert_shares_add_up(c: Conservation):
    s = c.summary()
    assert not s.near_zero
    assert s.tokens + s.absorbed + s.breaks == pytest.approx(1 - s.residual, abs=1e-12)
    assert abs(s.residual) == pytest.approx(abs(c.residual / c.output_value), rel=1e-12)
    assert s.tokens == pytest.approx(c.input_total / c.output_value, rel=1e-12)


@pytest.mark.parametrize("rules", TRANSFORMER_SETS)
@pytest.mark.parametrize("target", [0, 1])
def test_shares_add_to_the_explained_value_on_bert(bert_graph, rules, target):
    e = rulegraph.explain(bert_graph, rules, text=TEXT, target=target)
    assert_shares_add_up(e.audit.conservation)
    assert abs(e.audit.conservation.summary().residual) <= 1e-4          # float32: the residual is rounding


@pytest.mark.parametrize("rules", [EPSILON, Z_RULE], ids=["epsilon", "z"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shares_add_to_the_explained_value_on_mlps(rules, seed):
    net = random_network([4, 6, 6, 3], seed, bias=True, residual=True, activation="Tanh")
    x = torch.from_numpy(np.random.default_rng(seed).normal(size=(1, 4)))
    e = rulegraph.explain(net, rules, {"x": x}, target=seed % 3, dtype=torch.float64)
    assert_shares_add_up(e.audit.conservation)
    assert abs(e.audit.conservation.summary().residual) <= 1e-9


def test_an_explained_value_near_zero_is_said_not_divided():
    c = Conservation(output_value=1e-6, input_total=2.0, absorbed=-1.5, breaks=-0.5 + 1e-6, residual=0.0,
                     relative_error=0.0)
    s = c.summary()
    assert s.near_zero and not s.flagged and s.tokens is None
    assert "near 0" in s.sentence and "%" not in s.sentence


def test_the_flag_fires_when_breaks_leave_the_tokens_the_opposite_sign(bert_graph):
    e = rulegraph.explain(bert_graph, "gi", text=TEXT, target=1)
    c = e.audit.conservation
    assert c.breaks / c.output_value > 0.5 and c.input_total / c.output_value < 0     # the case is what it says
    s = c.summary("gi")
    assert s.flagged and "opposite sign" in s.sentence
    assert all(f"`{m}`" in s.sentence for m in CONSERVE_TO_TOKENS)


def test_no_flag_for_epsilon_where_the_tokens_carry_most(bert_graph):
    e = rulegraph.explain(bert_graph, "epsilon", text=TEXT, target=0)
    s = e.audit.conservation.summary("epsilon")
    assert s.tokens >= LITTLE and not s.flagged and "FLAGGED" not in s.sentence
    assert s.breaks == 0.0


def test_the_sets_named_as_conserving_to_the_tokens_break_nothing(bert_graph):
    """The advice's list checked against data: every set it names has breaks = 0 exactly; every
    shipped transformer set with breaks is left out of it."""
    for name in shipped_rule_sets(None):
        if RuleSet.load(name).models != "transformers":
            continue
        breaks = rulegraph.explain(bert_graph, name, text=TEXT, target=1).audit.conservation.breaks
        if name in CONSERVE_TO_TOKENS:
            assert breaks == 0.0, name
        elif breaks != 0.0:
            assert name not in CONSERVE_TO_TOKENS


def test_a_batch_says_its_audit_is_the_batch_sum(bert_graph):
    e = rulegraph.explain(bert_graph, "lrp-ah-ln", text=[TEXT, "the movie was good"], target=0)
    assert "the batch's 2 items summed" in e.audit.conservation.summary("lrp-ah-ln", 2).sentence
    assert "items summed" in e.to_dict()["conservation"]["sentence"]


def test_the_sentence_in_the_terminal_the_page_and_json(bert_onnx, bert_graph, tmp_path, capsys):
    e = rulegraph.explain(bert_graph, "gi", text=TEXT, target=1)
    sentence = e.audit.conservation.summary("gi").sentence
    doc = e.to_dict()
    assert doc["conservation"]["sentence"] == sentence
    assert doc["conservation"]["shares"]["flagged"] is True
    assert doc["conservation"]["shares"]["tokens"] == pytest.approx(
        doc["conservation"]["input_total"] / doc["conservation"]["output_value"])
    page = explanation_fragment(e)
    assert "the tokens carry" in page and "<code>epsilon</code>" in page
    assert page.index("the tokens carry") < page.index("unexplained residual")      # the ledger stays below
    assert "the tokens carry" in e._repr_html_()

    path = tmp_path / "e.json"
    code = main(["explain", str(bert_onnx), "-r", "gi", "-t", TEXT, "--target", "1", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0
    assert json.loads(path.read_text())["conservation"]["sentence"].startswith("the tokens carry")
    flat = " ".join(out.split())
    assert "the tokens carry" in flat and "FLAGGED: the tokens carry the opposite sign" in flat
    assert flat.index("the tokens carry") < flat.index("unexplained residual")
