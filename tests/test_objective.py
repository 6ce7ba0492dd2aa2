"""The objective grammar (rulegraph.objective): terms, coefficients, quoted tokens, limits, and the
seed's closed form against autograd of the expression."""
from __future__ import annotations

import pytest
import torch

from rulegraph.errors import InputError
from rulegraph.objective import MAX_LENGTH, MAX_TERMS, Term, parse


@pytest.mark.parametrize("text, terms", [
    ("logit[3]", [Term(1.0, "logit", 3)]),
    ("  -logit[3]+2.5*logprob[ 7 ] ", [Term(-1.0, "logit", 3), Term(2.5, "logprob", 7)]),
    ("logit[\" Paris\"] - logit[' London']", [Term(1.0, "logit", " Paris"), Term(-1.0, "logit", " London")]),
    (r"logprob['it\'s'] - .5e1 * logit[0]", [Term(1.0, "logprob", "it's"), Term(-5.0, "logit", 0)]),
])
def test_parse(text, terms):
    assert list(parse(text).terms) == terms


@pytest.mark.parametrize("text, message", [
    ("", "objective is empty"),
    ("logit[3] logit[4]", "cannot read column 10"),
    ("logit[3] +", "cannot read column 10"),
    ("prob[3]", "unknown term 'prob' at column 1; valid: logit, logprob"),
    ("logit[-3]", "cannot read column 1"),
    ("__import__('os')", "cannot read column 1"),
    (" + ".join(["logit[1]"] * (MAX_TERMS + 1)), f"more than {MAX_TERMS} terms"),
    ("logit[1]" + " " * MAX_LENGTH, f"the limit is {MAX_LENGTH}"),
])
def test_parse_errors_name_the_place(text, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse(text)


def test_seed_is_the_gradient_of_the_expression_with_p_held_constant():
    """Σ w_j z_j with w = seed: for logits the coefficients, for logprob terms ∂ log p_t/∂z = e_t − p."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 11, generator=g, dtype=torch.float64, requires_grad=True)
    objective = parse("logprob[2] - 0.5*logprob[7] + 3*logit[4] - logit[2]")
    logp = z.log_softmax(-1)
    value = logp[:, 2] - 0.5 * logp[:, 7] + 3 * z[:, 4] - z[:, 2]
    value.sum().backward()
    assert torch.allclose(objective.seed(z.detach()), z.grad, atol=1e-14)
    assert objective.value(z) == pytest.approx(value.tolist(), abs=1e-12)


def test_ids_are_checked_against_the_output():
    with pytest.raises(InputError, match="id 11 is out of range; the output has 11 classes"):
        parse("logit[11]").seed(torch.zeros(1, 11))
    with pytest.raises(InputError, match="is text; resolve it"):
        parse("logit['a']").seed(torch.zeros(1, 11))
    assert parse("logit['a'] - logit[1]").resolve(lambda text: 5).tokens == [5, 1]


def test_a_span_reads_each_term_at_its_position():
    """``KIND[TOKEN]@P``: the seed is the gradient of Σ terms at their positions, p held per position."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(2, 5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    objective = parse("logprob[2]@1 + 2*logit[7]@3 - logprob[4]@3")
    assert objective.positions == [1, 3] and objective.terms[1] == Term(2.0, "logit", 7, 3)
    logp = z.log_softmax(-1)
    value = logp[:, 1, 2] + 2 * z[:, 3, 7] - logp[:, 3, 4]
    value.sum().backward()
    assert torch.allclose(objective.seed(z.detach()), z.grad, atol=1e-14)
    assert objective.value(z) == pytest.approx(value.tolist(), abs=1e-12)


def test_span_builds_a_continuation_objective():
    from rulegraph.objective import span
    objective = span([7, 2, 8], 3, "logit")
    assert objective == parse("logit[7]@3 + logit[2]@4 + logit[8]@5")
    with pytest.raises(InputError, match="one of logit, logprob"):
        span([1], 0, "prob")
    with pytest.raises(InputError, match="the span has no tokens"):
        span([], 0)


@pytest.mark.parametrize("text, out, message", [
    ("logit[1]@2 + logit[3]", (1, 4, 5), "the term at column 14 has no @POSITION and the first has one"),
    ("logit[1] + logit[3]@2", (1, 4, 5), "the term at column 12 has a @POSITION and the first has none"),
    ("logit[1]@4", (1, 4, 5), "position 4 is out of range; the output has 4 positions"),
    ("logit[1]@0", (1, 5), "terms with @POSITION read a [batch, positions, classes] output"),
])
def test_span_errors_name_the_place(text, out, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse(text).seed(torch.zeros(out))
