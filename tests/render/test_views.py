"""How results show themselves, one implementation for the terminal, notebooks and files: the
terminal heatmap carries colour codes, Explanation and Generation have a one-screen repr, an HTML
view for notebooks (``_repr_html_``), a page and a figure; what was explained is named."""
from __future__ import annotations

import os
import subprocess
import sys

import matplotlib
import pytest
import torch

import rulegraph

matplotlib.use("Agg")
TEXT = "w1 w2 w3 w4"


def test_the_terminal_heatmap_is_coloured_when_colour_is_forced(bert_onnx):
    code = ("from rulegraph.cli import main; import sys; "
            f"sys.exit(main(['explain', {str(bert_onnx)!r}, '-r', 'lrp-ah-ln', '-t', {TEXT!r}]))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "FORCE_COLOR": "1", "COLORTERM": "truecolor", "COLUMNS": "120"})
    assert run.returncode == 0, run.stderr
    assert "\x1b[" in run.stdout and "48;2;" in run.stdout        # a 24-bit background behind the tokens


def test_an_explanation_shows_itself_in_one_screen_in_html_and_as_a_figure(bert_onnx, tmp_path):
    e = rulegraph.explain(bert_onnx, "lrp-ah-ln", text=TEXT)
    shown = repr(e)
    assert shown.startswith("Explanation(lrp-ah-ln: logits[") and "w1" in shown and "audit:" in shown
    assert len(shown.splitlines()) <= 6
    html = e._repr_html_()
    assert html.startswith('<div class="rulegraph">') and "w3" in html and "conservation" in html
    assert "Σ relevance at input_ids" in html and "Σ relevance at token_type_ids" in html
    page = e.to_html(tmp_path / "e.html")
    assert (tmp_path / "e.html").read_text() == page and page.startswith("<!doctype html>")
    with pytest.raises(rulegraph.RulegraphError, match="exists; pass overwrite=True"):
        e.to_html(tmp_path / "e.html")
    figure = e.plot()
    assert len(figure.axes[0].patches) == len(e.tokens[0])


def test_a_generation_shows_itself_too(causal_lm):
    _, path = causal_lm
    g = rulegraph.generate(path, "gi", text="w1 w2 w3", max_new_tokens=2, ignore_eos=True)
    assert repr(g).startswith("Generation(gi, greedy: 2 token(s)")
    html = g._repr_html_()
    assert "<table>" in html and "prompt share" in html and g.columns[0].strip() in html
    assert g.plot().axes[0].images


def test_the_verdict_says_whether_breaks_are_by_design(bert_onnx):
    from rulegraph.render.colour import verdict
    e = rulegraph.explain(bert_onnx, "gi", text=TEXT, dtype=torch.float64)
    assert verdict(e).startswith("conserved") and "by design" in verdict(e)
    assert "by design" not in verdict(rulegraph.explain(bert_onnx, "epsilon", text=TEXT, dtype=torch.float64))
