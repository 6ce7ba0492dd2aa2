"""The ``achtibat2024`` preset (AttnLRP, Achtibat et al., ICML 2024, Table 1) against an example worked out by
hand, end to end through ``rulegraph evaluate``; the ``zero`` removal it uses (a zero token embedding fed
through an override of the embedding lookup) against the closed form of that model; and the area between the
least- and most-relevant-first curves (``morf-lerf``) on the bag-of-words closed form.

The hand-built model is a bag of words with a bias added after the lookup, like a position embedding:
``logits = Σ_t mask_t · (E[id_t] + b)``, so zeroing token t's embedding leaves ``b`` there, which no token id
can give ([UNK]'s row is not zero here)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import tiny
from closed_form import REMOVAL, case, ideal, model, trapezoid
from rulegraph.cli import main
from rulegraph.errors import InputError
from rulegraph.evaluate import metrics as M
from rulegraph.evaluate import protocols as P
from rulegraph.loaders import load
from rulegraph.methods import TokenModel, Tokens
from rulegraph.tokens import ZERO

V = tiny.VOCAB.index
TEXT = "w5 w17 w9 w30"
#: the explained (positive) logit's part of each word's row; [UNK]'s row is not zero
POSITIVE = {"w5": 2.0, "w17": -1.0, "w9": 0.5, "w30": 1.5, "[UNK]": 0.75}
BIAS = (0.25, 0.5)


def build(folder):
    """``folder/model.onnx`` + tokenizer.json: logits = Σ_t mask_t (E[id_t] + b)."""
    table = np.zeros((len(tiny.VOCAB), 2), dtype=np.float32)
    for word, value in POSITIVE.items():
        table[V(word), 1] = value
    nodes = [
        helper.make_node("Gather", ["E", "input_ids"], ["emb"], name="embeddings"),
        helper.make_node("Add", ["emb", "b"], ["h"], name="bias"),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"], name="unsqueeze"),
        helper.make_node("Mul", ["h", "mask3"], ["masked"], name="mul"),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["logits"], keepdims=0, name="sum"),
    ]
    graph = helper.make_graph(
        nodes, "bias-bow",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(table, "E"), numpy_helper.from_array(np.array(BIAS, dtype=np.float32), "b"),
         numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1")])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    entry = onnx_model.metadata_props.add()
    entry.key, entry.value = "rulegraph.labels", json.dumps(["negative", "positive"])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_model, folder / "model.onnx")
    tiny.tokenizer().save(str(folder / "tokenizer.json"))
    return folder / "model.onnx"


@pytest.fixture(scope="module")
def bias_bow(tmp_path_factory):
    return build(tmp_path_factory.mktemp("bias_bow"))


def test_a_zero_embedding_leaves_what_is_added_after_the_lookup(bias_bow):
    """[CLS] w5 w17 w9 w30 [SEP]: positive logit 6 positions × 0.5 + (2 − 1 + 0.5 + 1.5) = 6, negative
    6 × 0.25 = 1.5. Zeroing w5 and w9 takes their rows away (6 − 2.5 = 3.5) and keeps b; [UNK] there
    instead gives 3.5 + 2 × 0.75 = 5."""
    runner = TokenModel(load(bias_bow), zeroed=True)
    ids = (V("[CLS]"), V("w5"), V("w17"), V("w9"), V("w30"), V("[SEP]"))
    full = Tokens(ids)
    zeroed = full.remove([1, 3], ZERO)
    unk = full.remove([1, 3], V("[UNK]"))
    logits = runner([full, zeroed, unk, Tokens(ids[:3]).remove([1], ZERO)])
    assert logits.tolist() == [[1.5, 6.0], [1.5, 3.5], [1.5, 5.0], [0.75, 0.5]]


def test_zero_removal_needs_the_interpreter_and_a_runner_made_for_it(bias_bow):
    graph = load(bias_bow)
    with pytest.raises(InputError, match="onnxruntime runtime cannot"):
        TokenModel(graph, zeroed=True, runtime="onnxruntime")
    assert TokenModel(graph, zeroed=True, runtime="auto").runtime == "rulegraph"
    with pytest.raises(InputError, match="zero-embedding positions"):
        TokenModel(graph, runtime="rulegraph")([Tokens((V("w5"), V("w9"))).remove([0], ZERO)])


def test_the_preset_end_to_end_against_the_hand_computed_areas(bias_bow, tmp_path):
    """gi scores each word by its row's positive part (2, −1, 0.5, 1.5: the Gather output times a one-hot
    gradient). 4 removable words, fractions 0, 10, …, 100 %: ⌊4k + ½⌋ = 0 0 1 1 2 2 2 3 3 4 4 removed.
    Most relevant first w5 w30 w9 w17: logits 6, 4, 2.5, 2, 3; least relevant first w17 w9 w30 w5:
    6, 7, 6.5, 5, 3. LeRF − MoRF per count 0, 3, 4, 3, 0 → at the 11 fractions 0 0 3 3 4 4 4 3 3 0 0,
    area 0.1 × 24 = 2.4. AOPC of the logit (MoRF only): mean of 0 0 2 2 3.5 3.5 3.5 4 4 3 3 = 28.5 / 11;
    [UNK] in place of the zero embedding would give another AOPC (each removed word adds 0.75 back)."""
    data = tmp_path / "texts.csv"
    data.write_text(f"text\n{TEXT}\n")
    out = tmp_path / "run"
    assert main(["evaluate", str(bias_bow), "--data", str(data), "--methods", "gi", "--protocol", "achtibat2024",
                 "--metrics", "morf-lerf,aopc", "--out", str(out), "--quiet"]) == 0
    row = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert row["target"] == 1 and row["logit"] == pytest.approx(6.0)
    assert row["curves"]["morf-lerf"] == pytest.approx([0, 0, 3, 3, 4, 4, 4, 3, 3, 0, 0], abs=1e-6)
    assert row["metrics"]["morf-lerf"] == pytest.approx(2.4, abs=1e-6)
    assert row["metrics"]["aopc"] == pytest.approx(28.5 / 11, abs=1e-6)
    doc = json.loads((out / "summary.json").read_text())
    assert doc["protocol"]["name"] == "achtibat2024" and doc["protocol"]["removal"] == "zero"
    assert doc["protocol"]["score"] == "logit" and doc["protocol"]["overrides"] == {}
    # without --metrics the preset reports its own metric
    default = tmp_path / "default"
    assert main(["evaluate", str(bias_bow), "--data", str(data), "--methods", "gi", "--protocol", "achtibat2024",
                 "--out", str(default), "--quiet"]) == 0
    assert list(json.loads((default / "results.jsonl").read_text().splitlines()[0])["metrics"]) == ["morf-lerf"]


def test_morf_lerf_against_the_bag_of_words_closed_form():
    """On the linear model with its exact contributions as scores: the curves of the logit and of the
    probability, most- and least-relevant first, from the weights (closed_form.py)."""
    c = case()
    order = ideal(c)
    least = order[::-1]

    def logit(removed):         # the explained logit ±s/2 less the removed tokens' exact contributions
        return sum(c.scores) - sum(c.scores[i] for i in removed)

    grid = (0.0, 20.0, 50.0, 100.0)
    counts = [0, 2, 5, 10]           # ⌊10k + ½⌋ of the 10 removable tokens
    expected = trapezoid([logit(least[:n]) - logit(order[:n]) for n in counts], [k / 100 for k in grid])
    metric = M.MorfLerf(REMOVAL, grid=grid, score="logit")
    result = M.compute(metric, model, c)
    assert result.value == pytest.approx(expected, abs=1e-9)
    assert result.curve[0] == pytest.approx(0) and result.curve[-1] == pytest.approx(0)
    # equal scores carry no ranking: both orders remove by position, the area is 0
    flat = case(scores=[0.0] * len(c.scores))
    assert M.compute(metric, model, flat).value == pytest.approx(0, abs=1e-12)
    # without a protocol grid, the curve fractions 0, 1/steps, …, 1
    assert M.MorfLerf(REMOVAL, steps=4).xs() == [0, 0.25, 0.5, 0.75, 1]


def test_the_preset_is_declared_as_the_paper_states_it():
    p = P.PROTOCOLS.get("achtibat2024")
    assert (p.removal, p.score, p.metrics) == ("zero", "logit", ("morf-lerf",))
    assert p.grid == tuple(float(k) for k in range(0, 101, 10))
    assert "zero embeddings" in p.summary() and "Achtibat" in p.description
