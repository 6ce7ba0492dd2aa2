"""`rulegraph explain … --targets all|top-K|LIST` as a user types it, and `explain(…, targets=…)`:
every target of one input from one forward and one walk, each equal to `--target` alone (float64 to
1e-12 relative), with its own audit."""
from __future__ import annotations

import json

import pytest
import torch

import rulegraph
import tiny
from shell import rulegraph as run


def test_every_class_on_the_command_line_equals_each_target_alone(bert_onnx, tmp_path):
    model = str(bert_onnx)
    ran = run(["explain", model, "-r", "lrp-ah-ln", "-t", "w1 w2 w3", "--targets", "all", "--dtype", "float64",
               "--json", "all.json", "--png", "t.png", "--html", "t.html"], tmp_path)
    ran.ok()
    docs = json.loads((tmp_path / "all.json").read_text())
    classes = len(docs)
    assert classes >= 2 and [d["target"] for d in docs] == list(range(classes))
    assert sorted(p.name for p in tmp_path.glob("t-*.png")) == [f"t-{c + 1}.png" for c in range(classes)]
    assert f"2/{classes}" in ran.out and (tmp_path / "t.html").exists()
    for c in (0, classes - 1):
        run(["explain", model, "-r", "lrp-ah-ln", "-t", "w1 w2 w3", "--target", str(c), "--dtype", "float64",
             "--json", f"{c}.json"], tmp_path).ok()
        alone = json.loads((tmp_path / f"{c}.json").read_text())
        for key, r in alone["relevance"].items():
            want, got = torch.tensor(r, dtype=torch.float64), torch.tensor(docs[c]["relevance"][key], dtype=torch.float64)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12 * float(want.abs().max()))
        scale = abs(alone["conservation"]["output_value"])
        for k, v in alone["conservation"].items():
            if isinstance(v, float):
                assert docs[c]["conservation"][k] == pytest.approx(v, abs=1e-12 * scale), k


@pytest.mark.parametrize("argv, message", [
    (["--targets", "all", "--target", "1"], "give --targets or --target, not both"),
    (["--targets", "top-x"], "K must be a whole number ≥ 1"),
    (["--targets", "1,,2"], "give all, top-K or a comma-separated list"),
    (["--targets", "0,9"], "target 9 is out of range"),
])
def test_bad_targets_are_one_line(bert_onnx, tmp_path, argv, message):
    ran = run(["explain", str(bert_onnx), "-r", "epsilon", "-t", "w1 w2", *argv], tmp_path)
    assert ran.code == 2 and message in ran.err and "Traceback" not in ran.err, ran.err


def test_top_k_tokens_by_their_text_in_python(causal_lm):
    _, path = causal_lm
    t = rulegraph.explain(path, "attnlrp", text="w1 w2 w3", targets=[" w4", " w5"], dtype=torch.float64)
    ids = [tiny.lm_tokenizer().token_to_id(w) for w in ("w4", "w5")]
    assert [e.target[0] for e in t] == ids and len(t) == 2
    for e, i in zip(t, ids):
        alone = rulegraph.explain(path, "attnlrp", text="w1 w2 w3", target=i, dtype=torch.float64)
        want = alone.relevance["input_ids"]
        torch.testing.assert_close(e.relevance["input_ids"], want, rtol=0, atol=1e-12 * float(want.abs().max()))
        assert e.tokens == alone.tokens
    assert "2 explanation(s)" in repr(t) and set(t.to_dict()) == {"targets"}
    top = rulegraph.explain(path, "ig", text="w1 w2 w3", targets="top-2", steps=4)
    logits = top[0].output_tensor[0, -1]
    assert [e.target[0] for e in top] == logits.topk(2).indices.tolist()
