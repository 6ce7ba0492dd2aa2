"""Evaluation protocols (rulegraph/evaluate/protocols.py): each preset against a hand-computed AOPC on
the bag-of-words model (closed_form.py), an external protocol reproduced per sentence end to end, the
counting rules, and the run identity of the default protocol."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

import bow
import tiny
from closed_form import IDS, case, ideal, model, p_target
from rulegraph.errors import InputError
from rulegraph.evaluate import metrics as M
from rulegraph.evaluate import protocols as P
from rulegraph.evaluate.runner import Config, Evaluation

UNK = tiny.VOCAB.index("[UNK]")

#: Tokens removed at each grid point for the 10 removable tokens of closed_form.IDS, worked out by hand.
HAND = {
    # k = 0, 1, …, 20 %: ⌊k/10 + ½⌋ → 0 for k < 5, 1 for 5…14, 2 for 15…20
    "default": [0] * 5 + [1] * 10 + [2] * 6,
    "yang2023": [0] * 5 + [1] * 10 + [2] * 6,
    # k = 0, 10, …, 90 %: exactly 0…9
    "decompx": list(range(10)),
    # k = j/9, j = 1…9: 10j/9 = 1.1, 2.2, 3.3, 4.4, 5.6, 6.7, 7.8, 8.9, 10 → half up
    "mask-lrp": [1, 2, 3, 4, 6, 7, 8, 9, 10],
    # k = 0, 10, …, 100 %: 0…10
    "ali2022": list(range(11)),
    "achtibat2024": list(range(11)),
    # k = 10…50 %, max(1, round(k·10)): 1…5
    "mask-10-50": [1, 2, 3, 4, 5],
}


def metric_of(preset: str) -> M.AOPC:
    p = P.PROTOCOLS.get(preset)
    removal = M.Removal(p.removal, None if p.removal == "delete" else UNK, UNK, p.count, p.min_count)
    return M.build(["aopc"], removal, {}, {"grid": p.grid, "score": p.score})[0]


def logit(c, removed):
    """The explained logit ±s/2 of the bag of words with these positions removed."""
    sign = 1 if c.target == 1 else -1
    return sign * (float(bow.weights()[IDS].sum()) - sum(bow.weights()[IDS[i]] for i in removed)) / 2


@pytest.mark.parametrize("preset", list(HAND))
def test_each_preset_gives_the_hand_computed_aopc(preset):
    """Removed tokens count 0 in the bag of words ([UNK], [PAD], deletion and a zero embedding alike), so
    the AOPC is the mean of f(x) − f(x without the top-c tokens) over the hand-counted c, f the preset's
    score (the probability, or the logit under achtibat2024)."""
    c = case()
    order = ideal(c)
    f = logit if P.PROTOCOLS.get(preset).score == "logit" else p_target
    expected = float(np.mean([f(c, []) - f(c, order[:n]) for n in HAND[preset]]))
    result = M.compute(metric_of(preset), model, c)
    assert result.value == pytest.approx(expected, abs=1e-12)
    assert len(result.curve) == len(HAND[preset])


def test_every_declared_preset_is_tested_and_states_its_fields():
    assert set(P.PROTOCOLS) == set(HAND)
    for name, p in P.PROTOCOLS.items():
        assert p.description and p.summary().startswith(f"protocol {name}:")
    assert P.PROTOCOLS.get("mask-lrp").min_length == 20 and P.PROTOCOLS.get("mask-lrp").removal == "pad"
    assert P.PROTOCOLS.get("ali2022").settings == {"steps": 10}


def test_scores_logit_and_log_odds():
    c = case()
    order = ideal(c)
    s = float(bow.weights()[IDS].sum())
    sign = 1 if c.target == 1 else -1

    def logit_of(removed):     # the explained logit ±s/2 of the bag of words
        return sign * (s - sum(bow.weights()[IDS[i]] for i in removed)) / 2

    def log_odds(removed):
        p = p_target(c, removed)
        return math.log(p / (1 - p))
    for score, f in (("logit", logit_of), ("log-odds", log_odds)):
        metric = M.build(["aopc"], M.Removal("unk", UNK, UNK), {}, {"grid": (0.0, 10.0, 20.0), "score": score})[0]
        expected = np.mean([f([]) - f(order[:n]) for n in (0, 1, 2)])
        assert M.compute(metric, model, c).value == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("rule, expected", [
    ("round-half-up", [0, 1, 2, 2, 3, 3]), ("round", [0, 0, 2, 2, 2, 3]), ("floor", [0, 0, 1, 2, 2, 3]),
    ("ceil", [0, 1, 2, 2, 3, 3])])
def test_counting_rules(rule, expected):
    # fractions 0, 0.1, 0.3, 0.4, 0.5, 0.6 of 5 tokens: 0, 0.5, 1.5, 2, 2.5, 3 (the float 3.0000000000000004)
    assert [P.count(rule, f, 5) for f in (0, 0.1, 0.3, 0.4, 0.5, 0.6)] == expected
    assert P.count(rule, 0.29, 100) in (28, 29) and P.count("floor", 0.29, 100) == 29
    assert P.count(rule, 0.01, 5, minimum=1) >= 1 and P.count(rule, 0, 5, minimum=1) == 0
    assert P.count(rule, 1.0, 5, minimum=9) == 5


def external_aopc(text: str, w: np.ndarray) -> float:
    """A simple external protocol written independently of rulegraph: the top k % of the tokens by
    score (the exact contributions of the linear model) replaced by [MASK] (the toy vocabulary has
    none, so [UNK], weight 0), k = 10…50 %, count = max(1, round(k·L)), AOPC = mean over k of
    p(ŷ|x) − p(ŷ|x̃ₖ)."""
    ids = [tiny.VOCAB.index(t) for t in text.split()]
    weights = [float(w[i]) for i in ids]
    s = sum(weights)
    target = 1 if s > 0 else 0

    def p(z):
        return 1 / (1 + math.exp(-z)) if target == 1 else 1 / (1 + math.exp(z))
    score = [x if target == 1 else -x for x in weights]
    order = sorted(range(len(ids)), key=lambda i: (-score[i], i))
    drops = []
    for k in (0.1, 0.2, 0.3, 0.4, 0.5):
        n = max(1, round(k * len(ids)))
        drops.append(p(s) - p(s - sum(weights[i] for i in order[:n])))
    return sum(drops) / len(drops)


def test_a_preset_with_overrides_reproduces_an_external_protocol_per_sentence(tmp_path):
    model_path = bow.build(tmp_path / "bow")
    rng = np.random.default_rng(1)
    lengths = [5, 25, 15, 35, 3, 45, 12, 7, 1, 50]      # where round(kL) and ⌊kL + ½⌋ disagree, and not
    texts = [" ".join(f"w{i}" for i in rng.choice(95, size=n, replace=False)) for n in lengths]
    data = tmp_path / "data.csv"
    with data.open("w", newline="") as handle:
        csv.writer(handle).writerows([["text"], *[[t] for t in texts]])
    protocol = P.resolve("default", removal="mask", grid=(10, 20, 30, 40, 50), count="round", min_count=1)
    config = Config(model=str(model_path), data=str(data), methods=["gi"], metrics=["aopc"], removal=protocol.removal,
                    grid=list(protocol.grid), count=protocol.count, min_count=protocol.min_count)
    Evaluation(config, tmp_path / "out", progress=False).run()
    rows = {r["example"]: r for r in map(json.loads, (tmp_path / "out" / "results.jsonl").open())}
    w = bow.weights()
    for i, text in enumerate(texts):
        assert abs(rows[i]["metrics"]["aopc"] - external_aopc(text, w)) <= 1e-6, (i, len(text.split()))
    # the default protocol differs from it (k = 0 in the grid, other counts): the reason for protocols
    default = Evaluation(Config(model=str(model_path), data=str(data), methods=["gi"], metrics=["aopc"],
                                settings={"aopc_k": 50, "aopc_step": 10}), tmp_path / "default", progress=False).run()
    assert abs(default.table["gi"]["aopc"]["mean"] - np.mean([external_aopc(t, w) for t in texts])) > 1e-3


def test_the_default_protocol_keeps_the_run_identity_and_others_change_it(tmp_path):
    model_path = bow.build(tmp_path / "bow")
    data = tmp_path / "d.csv"
    data.write_text("text\nw1 w2 w3\n")
    base = Config(model=str(model_path), data=str(data), methods=["gi"])
    identity = base.identity()
    assert not any(k.startswith("protocol") for k in identity)
    assert Config(model=str(model_path), data=str(data), methods=["gi"], removal="mask").identity() == identity
    decompx = Config(model=str(model_path), data=str(data), methods=["gi"], protocol="decompx").identity()
    assert decompx["protocol_grid"] == [float(k) for k in range(0, 100, 10)] and decompx["removal"] == "mask"
    other = Config(model=str(model_path), data=str(data), methods=["gi"], protocol="decompx",
                   grid=[float(k) for k in range(0, 100, 10)], count="round", min_length=3).identity()
    assert other["protocol_grid"] == [float(k) for k in range(0, 100, 10)]
    assert other["protocol_count"] == "round" and other["protocol_min_length"] == 3
    ali = Config(model=str(model_path), data=str(data), methods=["gi"], protocol="ali2022").identity()
    assert ali["settings"]["steps"] == 10


def test_short_inputs_are_skipped_and_counted(tmp_path):
    model_path = bow.build(tmp_path / "bow")
    data = tmp_path / "d.csv"
    data.write_text("text\nw1 w2 w3\nw4\nw5 w6 w7 w8 w9 w10\n")
    config = Config(model=str(model_path), data=str(data), methods=["gi"], metrics=["aopc"], min_length=6)  # [CLS]…[SEP] count
    summary = Evaluation(config, tmp_path / "out", progress=False).run()
    assert summary.skipped == 2 and summary.n_examples == 1
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["skipped"] == {"texts": 2, "min_length": 6}
    assert doc["protocol"]["name"] == "default" and doc["protocol"]["min_length"] == 6
    stored = json.loads((tmp_path / "out" / "config.json").read_text())
    assert stored["protocol"]["aopc_grid"][:3] == [0.0, 1.0, 2.0]
    with pytest.raises(InputError, match="every text has fewer than 50 tokens"):
        Evaluation(Config(model=str(model_path), data=str(data), methods=["gi"], min_length=50),
                   tmp_path / "none", progress=False).run()
    assert not (tmp_path / "none").exists()


def test_bad_protocol_fields_are_refused():
    with pytest.raises(InputError, match="unknown protocol 'decomp'; did you mean 'decompx'"):
        P.resolve("decomp")
    with pytest.raises(InputError, match="--aopc-grid must list distinct percentages in 0…100"):
        P.resolve("default", grid=(10, 150))
    with pytest.raises(InputError, match="comma-separated percentages"):
        P.parse_grid("10,x")
    with pytest.raises(InputError, match="unknown counting rule 'nearest'"):
        P.resolve("default", count="nearest")


def test_an_overridden_preset_is_described_as_such_and_replaced_settings_are_left_out(tmp_path):
    model_path = bow.build(tmp_path / "bow")
    data = tmp_path / "d.csv"
    data.write_text("text\nw1 w2 w3 w4\nw5 w6 w7\n")
    config = Config(model=str(model_path), data=str(data), methods=["gi"], metrics=["aopc"], protocol="decompx",
                    grid=[10.0, 20.0], count="round", settings={"aopc_k": 30})
    summary = Evaluation(config, tmp_path / "out", progress=False).run()
    assert summary.protocol.startswith("protocol decompx + --aopc-grid, --count:")
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())["protocol"]
    assert doc["overrides"] == {"grid": [10.0, 20.0], "count": "round"}
    assert doc["description"].startswith(P.PROTOCOLS.get("decompx").description.rstrip("."))
    assert doc["description"].endswith("Overridden here: --aopc-grid 10,20 (preset: 0,10,20,30,40,50,60,70,80,90); "
                                       "--count round (preset: round-half-up).")
    settings = json.loads((tmp_path / "out" / "summary.json").read_text())["config"]["settings"]
    assert "aopc_k" not in settings and "aopc_step" not in settings and "lodds_k" in settings
    # a preset as it is: its own text, nothing overridden, and the grid settings shown where no grid replaces them
    plain = Evaluation(Config(model=str(model_path), data=str(data), methods=["gi"], metrics=["aopc"]),
                       tmp_path / "plain", progress=False)
    plain.run()
    doc = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert doc["protocol"]["overrides"] == {} and doc["protocol"]["description"] == P.PROTOCOLS.get("default").description
    assert doc["config"]["settings"]["aopc_k"] == 20
