"""Each metric against its closed form on a linear bag-of-words model (tests/evaluate/bow.py).

With logit difference s = Σ_t w_t and a removed token counting 0, p(positive | x̃) = σ(s − Σ_removed w):
every curve is a sum of known weights through a sigmoid, computed here from the definitions
with numpy, independently of rulegraph.evaluate.metrics.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import bow
from rulegraph.errors import InputError
from rulegraph.evaluate import metrics as M
from rulegraph.methods import Tokens

W = bow.weights()
UNK, MASK_FREE = 4, None
REMOVAL = M.Removal("unk", UNK, UNK)
IDS = [2, 11, 17, 23, 31, 42, 55, 60, 71, 88, 93, 3]        # [CLS] … [SEP]: 10 removable tokens
SPECIAL = [True] + [False] * 10 + [True]


def model(seqs):
    """logits (−s/2, s/2) with s = Σ w over the sequence (the ONNX bow model, in numpy)."""
    s = torch.tensor([float(W[list(t.ids)].sum()) for t in seqs], dtype=torch.float64)
    return torch.stack([-s / 2, s / 2], 1)


def sigmoid(z):
    return 1 / (1 + math.exp(-z))


def case(scores=None, label=None, words=None, answer=None):
    s = float(W[IDS].sum())
    target = int(s > 0)
    sign = 1 if target == 1 else -1     # the exact contribution of a token to the explained logit: ±w/2
    scores = scores if scores is not None else [0.0] + [sign * float(W[i]) / 2 for i in IDS[1:-1]] + [0.0]
    return M.Case(Tokens(tuple(IDS)), SPECIAL, scores, target, label, words, answer)


def p_target(c, removed):
    """p(ŷ | x with these positions removed), closed form."""
    s = float(W[IDS].sum()) - float(sum(W[IDS[i]] for i in removed))
    return sigmoid(s) if c.target == 1 else 1 - sigmoid(s)


def ideal(c):
    """Removable positions, most relevant first, from the weights (ties impossible: distinct w)."""
    sign = 1 if c.target == 1 else -1
    return sorted([i for i in range(len(IDS)) if not SPECIAL[i]], key=lambda i: -sign * W[IDS[i]])


def trapezoid(ys, xs):
    return float(np.trapezoid(ys, xs)) if hasattr(np, "trapezoid") else float(np.trapz(ys, xs))


def test_aopc_of_the_exact_contributions_matches_the_closed_form():
    c = case()
    order = ideal(c)
    expected = np.mean([p_target(c, []) - p_target(c, order[:round(k / 100 * 10 + 1e-9)]) for k in (0, 10, 20)])
    # counts ⌊k·n/100 + ½⌋ with n = 10: 0, 1, 2 (no ties at .5 here)
    result = M.aopc(model, c, REMOVAL, k_max=20, k_step=10)
    assert result.value == pytest.approx(expected, abs=1e-12)
    assert len(result.curve) == 3 and result.curve[0] == 0


def test_aopc_of_the_exact_contributions_beats_every_other_order():
    """Removing the largest contributions first maximises each term, so no scoring does better."""
    c = case()
    best = M.aopc(model, c, REMOVAL, k_max=30, k_step=10).value
    rng = np.random.default_rng(0)
    for _ in range(20):
        other = case(scores=list(rng.normal(size=len(IDS))))
        assert M.aopc(model, other, REMOVAL, k_max=30, k_step=10).value <= best + 1e-12


def test_lodds_at_20_percent():
    c = case()
    order = ideal(c)
    expected = math.log(p_target(c, order[:2])) - math.log(p_target(c, []))
    assert M.lodds(model, c, REMOVAL, k=20).value == pytest.approx(expected, abs=1e-12)


def test_auac_reveals_most_relevant_first_from_all_unk():
    c = case()
    order = ideal(c)
    xs = [j / 5 for j in range(6)]
    ys = [p_target(c, order[round(f * 10):]) for f in xs]     # hidden = all but the first f·n revealed
    result = M.auac(model, c, REMOVAL, steps=5)
    assert result.curve == pytest.approx(ys, abs=1e-12)
    assert result.value == pytest.approx(trapezoid(ys, xs), abs=1e-12)
    assert ys[0] == pytest.approx(0.5)      # all [UNK]: s = 0


def test_au_mse_prunes_least_absolute_relevance_first():
    c = case()
    order = sorted([i for i in range(len(IDS)) if not SPECIAL[i]], key=lambda i: abs(W[IDS[i]]))
    xs = [j / 5 for j in range(6)]
    # logits (−s/2, s/2): both change by Δs/2, so the mean squared difference is (Δs/2)²
    ys = [(float(sum(W[IDS[i]] for i in order[:round(f * 10)])) / 2) ** 2 for f in xs]
    result = M.au_mse(model, c, REMOVAL, steps=5)
    assert result.curve == pytest.approx(ys, abs=1e-12)
    assert result.value == pytest.approx(trapezoid(ys, xs), abs=1e-12)


def test_hiding_and_revealing_games_count_correct_predictions():
    c = case(label=None)
    order = ideal(c)
    xs = [j / 5 for j in range(6)]

    def correct(removed):     # argmax of (−s/2, s/2); a tie (s = 0) is class 0, as torch's argmax
        kept = [IDS[i] for i in range(len(IDS)) if i not in removed]
        return float(int(float(W[kept].sum()) > 0) == c.target)
    hiding = [correct(order[:round(f * 10)]) for f in xs]
    revealing = [correct(order[round(f * 10):]) for f in xs]
    h, r = M.hiding(model, c, REMOVAL, steps=5), M.revealing(model, c, REMOVAL, steps=5)
    assert h.curve == hiding and r.curve == revealing
    assert h.value == pytest.approx(trapezoid(hiding, xs)) and r.value == pytest.approx(trapezoid(revealing, xs))
    assert hiding[0] == 1.0 and 0.0 in hiding


def test_accuracy_against_the_label_when_there_is_one():
    c = case(label=1)           # the model predicts 0 (s < 0): wrong on the full input
    assert M.hiding(model, c, REMOVAL, steps=5).curve[0] == 0.0


def test_word_deletion_deletes_whole_words_by_summed_score():
    words = [None, 0, 0, 1, 2, 2, 3, 4, 5, 6, 7, None]
    c = case(words=words)
    sign = 1 if c.target == 1 else -1
    groups = {}
    for i, wd in enumerate(words):
        if wd is not None:
            groups.setdefault(wd, []).append(i)
    ranked = sorted(groups.values(), key=lambda g: -sign * sum(W[IDS[i]] for i in g))
    ys = []
    for m in range(4):
        gone = {i for g in ranked[:m] for i in g}
        kept = [IDS[i] for i in range(len(IDS)) if i not in gone]
        ys.append(float(int(float(W[kept].sum()) > 0) == c.target))
    result = M.word_deletion(model, c, REMOVAL, max_words=3)
    assert result.curve == ys
    assert result.value == pytest.approx(sum(ys[1:]) / 3)


def test_word_deletion_skips_examples_predicted_wrongly():
    assert M.word_deletion(model, case(label=1), REMOVAL, max_words=3).value is None


def test_precision_at_k_counts_top_tokens_inside_the_answer():
    answer = [False] * 12
    c = case(answer=answer)
    top = ideal(c)
    for i in top[:2] + top[5:6]:
        answer[i] = True
    assert M.precision_at_k(c, k=3).value == pytest.approx(2 / 3)
    assert M.precision_at_k(c, k=6).value == pytest.approx(3 / 6)
    assert M.precision_at_k(case(), k=3).value is None       # no answer span: no value


def test_special_tokens_are_never_removed():
    c = case()
    metric = M.AOPC(REMOVAL, k_max=100, k_step=50)
    for seq in metric.inputs(c):
        assert seq.ids[0] == 2 and seq.ids[-1] == 3
    assert metric.perturbed(c, 100).ids == (2,) + (UNK,) * 10 + (3,)


def test_delete_and_replacement_agree_when_the_replacement_counts_zero():
    c = case()
    delete = M.Removal("delete", None, UNK)
    for name in ("aopc", "lodds", "au-mse", "hiding", "revealing"):
        metric_u, metric_d = M.build([name], REMOVAL)[0], M.build([name], delete)[0]
        assert M.compute(metric_u, model, c).value == pytest.approx(M.compute(metric_d, model, c).value, abs=1e-12)
    shorter = M.Deletion(delete, (20,)).perturbed(c, 20)
    assert len(shorter) == len(IDS) - 2


def test_fraction_counts_round_half_up():
    assert [M.count(f, 10) for f in (0, 0.04, 0.05, 0.15, 1)] == [0, 0, 1, 2, 10]


def test_bad_aopc_settings_are_input_errors():
    with pytest.raises(InputError, match="AOPC"):
        M.AOPC(REMOVAL, k_max=20, k_step=0)
