"""The graph's own rounding made visible (rulegraph.rounding): on a ``quantize_dynamic`` BERT, the
explanation says how far its forward is from onnxruntime's and how far a one-ulp nudge of the tables the
ids read moves onnxruntime's own output; on the float model it says nothing.

The difference is checked against onnxruntime run here on the file; the nudgeable model the spread is
measured on gives the file's output bit for bit when not nudged, and a nudge moves every table element by
exactly one ulp.
"""
from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

import rulegraph
import tiny
from rulegraph.cli import main
from rulegraph.passes import prepared
from rulegraph.rounding import NUDGES, _tables, measure, nudge, rounds

NAMES = ("input_ids", "attention_mask", "token_type_ids")
#: every weight matrix and embedding table multiplied by this, so that the tokens matter (as in
#: tests/methods/test_quantized_methods.py)
SCALE = 8.0
#: a batch large enough that one-ulp nudges cross rounding boundaries of the uint8 activations
BATCH, LENGTH = 32, 60


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    folder = tmp_path_factory.mktemp("rounding")
    model = tiny.build("bert")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and "LayerNorm" not in name:
                p.mul_(SCALE)
    source = tiny.onnx(model, folder / "float.onnx", names=NAMES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_dynamic(str(source), str(folder / "dynamic.onnx"), weight_type=QuantType.QInt8)
    return {"float": source, "dynamic": folder / "dynamic.onnx"}


def _feeds(batch: int = BATCH, length: int = LENGTH) -> dict[str, torch.Tensor]:
    return tiny.token_inputs(NAMES, batch=batch, length=length, seed=7)


def _onnxruntime(path, feeds) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})[0].astype(np.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_dynamically_quantized_bert_reports_its_difference_and_spread(files, dtype):
    e = rulegraph.explain(str(files["dynamic"]), "gi", _feeds(), dtype=dtype)
    r = e.extra["rounding"]
    theirs = _onnxruntime(files["dynamic"], _feeds())
    ours = e.output_tensor.double().numpy()
    assert r["difference"] == pytest.approx(np.abs(ours - theirs).max() / np.abs(theirs).max(), rel=1e-9)
    assert r["spread"] > 0          # measured 7.4e-3: the nudges cross rounding boundaries of this batch
    assert r["nudged"].startswith("tables model.bert.embeddings.word_embeddings.weight_quantized")
    assert r["line"] == (f"forward vs onnxruntime: {r['difference']:.1e} (onnxruntime's own one-ulp spread: "
                         f"{r['spread']:.1e} — {r['verdict']})")
    print(dtype, r["line"])


def test_the_nudgeable_model_is_the_file_when_not_nudged(files):
    graph = rulegraph.load(str(files["dynamic"]))
    canonized = prepared(graph, "gi")[0]
    assert rounds(canonized) and not rounds(prepared(rulegraph.load(str(files["float"])), "gi")[0])
    source, tables = _tables(canonized, "logits")
    assert set(tables) == {f"model.bert.embeddings.{t}_embeddings.weight_quantized"
                           for t in ("word", "token_type", "position")}
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy() for k, v in _feeds().items()}
    zero = {name: np.zeros_like(t) for name, t in tables.values()}
    plain = session.run(["logits"], {**feeds, **zero})[0]
    assert np.array_equal(plain, _onnxruntime(files["dynamic"], _feeds()).astype(np.float32))
    for pattern in range(NUDGES):
        for _, t in tables.values():
            moved = nudge(t, pattern)
            up, down = np.nextafter(t, np.float32(np.inf)), np.nextafter(t, np.float32(-np.inf))
            assert np.all((moved == up) | (moved == down)) and (moved == up).any() and (moved == down).any()
            assert np.array_equal(t + (moved - t), moved)          # the session's T + N is the nudged table


def test_a_float_model_gets_no_rounding_line(files, capsys):
    e = rulegraph.explain(str(files["float"]), "gi", _feeds(2, 8))
    assert "rounding" not in e.extra and "forward vs onnxruntime" not in repr(e)
    assert "forward vs onnxruntime" not in e.to_html() and "rounding" not in e.to_dict()
    code = main(["explain", str(files["float"]), "-r", "gi", "-i", "input_ids=5,6,7,8"])
    assert code == 0 and "forward vs onnxruntime" not in capsys.readouterr().out


def test_the_line_is_in_the_terminal_json_and_html(files, capsys, tmp_path):
    code = main(["explain", str(files["dynamic"]), "-r", "gi", "-i", "input_ids=5,6,7,8",
                 "--json", str(tmp_path / "e.json"), "--html", str(tmp_path / "e.html")])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    doc = json.loads((tmp_path / "e.json").read_text())
    line = doc["rounding"]["line"]
    assert line.startswith("forward vs onnxruntime: ") and "onnxruntime's own one-ulp spread: " in line
    assert f"quantized graph {line}" in out
    assert line in (tmp_path / "e.html").read_text().replace("&#x27;", "'")
    e = rulegraph.explain(str(files["dynamic"]), "gi", _feeds(2, 8))
    assert e.extra["rounding"]["line"] in repr(e)


def test_without_onnxruntime_a_note_says_so(files, monkeypatch):
    graph = prepared(rulegraph.load(str(files["dynamic"])), "gi")[0]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    r = measure(graph, _feeds(2, 8), "logits", torch.zeros(2, 2))
    assert r.difference is None and r.line() == "forward vs onnxruntime: not measured (onnxruntime is not installed)"
