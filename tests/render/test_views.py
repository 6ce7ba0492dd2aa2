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


def test_a_notebook_view_styles_only_itself(bert_onnx, causal_lm):
    """In a notebook the HTML sits in the notebook's page: its style may not restyle the page's body,
    headings or tables, so every selector is inside the view's own element."""
    import re
    _, path = causal_lm
    views = {"rulegraph": rulegraph.explain(bert_onnx, "gi", text=TEXT)._repr_html_(),
             "rulegraph-matrix": rulegraph.generate(path, "gi", text="w1 w2", max_new_tokens=2)._repr_html_()}
    for scope, view in views.items():
        assert view.startswith(f'<div class="{scope}"><style>')
        (style,) = re.findall(r"<style>(.*?)</style>", view, flags=re.S)
        selectors = [s.strip() for rule in style.split("}") if "{" in rule for s in rule.split("{")[0].split(",")]
        assert selectors and all(s == f".{scope}" or s.startswith(f".{scope} ") for s in selectors), selectors


def test_the_verdict_says_whether_breaks_are_by_design(bert_onnx):
    from rulegraph.render.colour import verdict
    e = rulegraph.explain(bert_onnx, "gi", text=TEXT, dtype=torch.float64)
    assert verdict(e).startswith("conserved") and "by design" in verdict(e)
    assert "by design" not in verdict(rulegraph.explain(bert_onnx, "epsilon", text=TEXT, dtype=torch.float64))
    shown = e._repr_html_()                                               # its `code` as code, not backticks
    assert "<code>gi</code>" in shown and "`" not in shown


def test_an_image_explanation_shows_its_size_in_one_screen_and_plots_the_picture(tmp_path):
    import cnn
    model = cnn.onnx(cnn.build("cnn"), tmp_path / "cnn.onnx", cnn.image(1, 16))
    pixels = cnn.image(1, 16).float()
    e = rulegraph.explain(model, "epsilon-gamma-box", {"pixel_values": pixels}, dtype=torch.float64)
    shown = repr(e)
    assert len(shown.splitlines()) <= 6 and max(map(len, shown.splitlines())) <= 160, shown
    pixel = e.boundary["pixel_values"][0].sum(0)
    row, col = divmod(int(pixel.abs().argmax()), 16)
    assert f"image pixel_values 3×16×16: Σ {float(pixel.sum()):+.4g}" in shown
    assert f"at row {row}, column {col}" in shown
    figure = e.plot()
    from rulegraph.render.colour import explained_name
    assert [a.get_title() for a in figure.axes[:3]] == ["input", "overlay", explained_name(e)]
    assert all(a.images for a in figure.axes[:3])                        # the picture, the overlay, the heatmap
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2)
    assert e.plot(ax=right) is fig and right.images and not left.images       # the relevance panel, in the axes given
    assert right.get_title() == explained_name(e)
    plt.close(fig)


def test_positions_without_a_tokenizer_are_each_their_own_word(bert, tmp_path):
    import tiny
    model = tiny.onnx(bert, tmp_path / "model.onnx")                      # no tokenizer.json beside it
    e = rulegraph.explain(model, "gi", tiny.token_inputs(length=5), dtype=torch.float64)
    assert e.tokens is None
    line = repr(e).splitlines()[2]
    named = [part.rsplit(" ", 1)[0] for side in line.split("   ") for part in side.split(": ", 1)[1].split(", ")
             if part != "—"]
    assert named and set(named) <= {"0", "1", "2", "3", "4"}, line


def test_a_batch_shows_each_item_and_the_batch_audit_once(bert_onnx):
    """The audit of a batch is its items' sum: shown once, after the items and named so, not under
    each item as if it were that item's."""
    import re
    texts = ["w1 w2 w3", "w4 w5", "w6"]
    e = rulegraph.explain(bert_onnx, "lrp-ah-ln", text=texts, dtype=torch.float64)
    for view in (e._repr_html_(), e.to_html()):
        headings = re.findall(r"<h2>(.*?)</h2>", view)
        assert headings[:3] == [f"item {i + 1}: {t}" for i, t in enumerate(texts)], headings
        assert headings[3:] == ["the batch's audit"] and view.count("<table>") == 1
        assert f"conservation of the batch (3 items summed)</th><th></th></tr><tr><td>explained output</td><td>" \
               f"{e.audit.conservation.output_value:+.5g}" in view
        assert abs(e.audit.conservation.output_value - sum(e.output_value)) < 1e-9
    assert repr(e).splitlines()[-1].endswith("(the batch's 3 items summed)")
