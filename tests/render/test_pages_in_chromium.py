"""The pages `rulegraph explain --html` writes, loaded in headless Chromium and read as a reader's
browser lays them out: a classifier's tokens (every token a span on its colour, the score in the
title), a language model's and an encoder–decoder's generation matrix (rows × generated tokens,
one cell each, grey where the step does not see the row), an image page whose picture decodes; and
a screenshot that is not blank. Checked by structure, not pixels (tests/browser.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import tiny
from browser import needs_chromium, open_page, screenshot_is_not_blank
from rulegraph.cli import main
from rulegraph.render.colour import NEGATIVE, POSITIVE

pytestmark = needs_chromium
TEXT = "w1 w2 w3 w4"


@pytest.fixture(scope="module")
def pages(tmp_path_factory, bert_onnx):
    """The four pages (and each one's JSON, the same explanation as data) written by the command line."""
    import cnn
    folder = tmp_path_factory.mktemp("pages")
    lm = tiny.onnx(tiny.causal_lm("gpt2"), folder / "lm" / "model.onnx", names=("input_ids", "attention_mask"))
    bart = tiny.seq2seq_onnx(tiny.seq2seq("bart"), folder / "bart" / "model.onnx")
    for model in (lm, bart):
        tiny.lm_tokenizer().save(str(model.parent / "tokenizer.json"))
    image = folder / "picture.png"
    rows, cols = np.mgrid[0:30, 0:40]
    Image.fromarray(np.stack([cols * 6, rows * 8, np.full_like(rows, 100)], -1).astype(np.uint8)).save(image)
    vision = cnn.onnx(cnn.build("cnn"), folder / "cnn.onnx", cnn.image(1, 16))
    runs = {"classifier": [str(bert_onnx), "-r", "lrp-ah-ln", "-t", TEXT],
            "generation": [str(lm), "-r", "attnlrp", "-t", "w1 w2 w3", "--generate", "24"],   # wider than the window
            "seq2seq": [str(bart), "-r", "attnlrp", "-t", "w5 w9 w14 w22", "--generate", "3", "--ignore-eos"],
            "image": [str(vision), "-r", "epsilon-gamma-box", "--image", str(image), "--size", "16", "--resize", "24"]}
    written = {}
    for name, argv in runs.items():
        html, data = folder / f"{name}.html", folder / f"{name}.json"
        assert main(["explain", *argv, "--html", str(html), "--json", str(data)]) == 0, name
        written[name] = (html.read_text(encoding="utf-8"), json.loads(data.read_text()))
    return folder, written


def _rgb(css: str) -> tuple[int, ...]:
    return tuple(int(v) for v in css[css.index("(") + 1:css.index(")")].split(","))[:3]


def _shown(page: str, folder, name: str) -> dict:
    report, shot = open_page(page, folder, f"browser-{name}")
    seen = screenshot_is_not_blank(shot)
    assert seen["inked"] > 0.02 and seen["colours"] > 20, (name, seen)
    assert report["width"] <= report["viewport"], f"{name}: the page is wider than the window"   # tables scroll
    return report["page"]


def test_a_classifiers_page_colours_every_token(pages):
    folder, written = pages
    page, data = written["classifier"]
    report = _shown(page, folder, "classifier")
    (spans,) = report["tokens"]
    assert [s["text"] for s in spans] == [t.strip() for t in data["texts"]]
    scores = data["relevance"]["input_ids"]
    assert [float(s["score"]) for s in spans] == pytest.approx(scores, rel=1e-5, abs=1e-9)
    strongest = max(range(len(scores)), key=lambda i: abs(scores[i]))
    assert _rgb(spans[strongest]["background"]) == (POSITIVE if scores[strongest] > 0 else NEGATIVE)
    for span, score in zip(spans, scores):          # white at 0, towards red for, blue against
        r, g, b = _rgb(span["background"])
        assert (r >= b) if score > 0 else (b >= r) if score < 0 else (r, g, b) == (255, 255, 255)
        assert span["ink"] in ("rgb(0, 0, 0)", "rgb(255, 255, 255)") and span["width"] > 0
    assert report["bars"] >= 4 * len(data["layers"])                     # the per-layer chart


@pytest.mark.parametrize("name", ["generation", "seq2seq"])
def test_a_generation_page_has_a_cell_per_row_and_generated_token(pages, name):
    folder, written = pages
    page, data = written[name]
    report = _shown(page, folder, name)
    (matrix,) = report["matrices"]
    assert matrix["header"] == len(data["columns"])
    assert [r["token"] for r in matrix["rows"]] == data["rows"]
    for row, expected in zip(matrix["rows"], data["matrix"]):
        assert len(row["cells"]) == len(data["columns"])
        for cell, value in zip(row["cells"], expected):
            assert (cell is None) == (value is None)                      # grey where the step does not see the row
            if cell is not None:
                assert float(cell["value"]) == pytest.approx(value, rel=1e-5, abs=1e-12)
                assert cell["background"].startswith("rgb(")
    groups = data["groups"]
    assert groups[0] == ("source" if name == "seq2seq" else "prompt") and len(groups) == len(data["rows"])


def test_an_image_page_shows_a_picture_that_decodes(pages):
    folder, written = pages
    page, data = written["image"]
    report = _shown(page, folder, "image")
    (image,) = report["images"]
    assert image["complete"] and image["width"] > 200 and image["height"] > 50 and image["shown"] > 0
    assert report["tokens"] == [] and "pixel_values" in data["relevance"]
