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
