"""The evaluation's figures: the conservation scatter labels each additive method with its median
per-item Σ R / logit and says, under the plot, why a conserving rule set can sit off the diagonal."""
from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt

from rulegraph.evaluate import plots


def test_the_conservation_scatter_names_each_methods_share_and_explains_the_diagonal(tmp_path, monkeypatch):
    rows = [{"method": "lrp", "logit": 2.0, "relevance_sum": 1.0}, {"method": "lrp", "logit": 4.0, "relevance_sum": 3.0},
            {"method": "lrp", "logit": 1.0, "relevance_sum": 0.9}, {"method": "lrp", "error": "boom"},
            {"method": "attention", "logit": 1.0, "relevance_sum": 1.0}]
    summary = SimpleNamespace(table={"lrp": {}, "attention": {}}, rows=rows)
    drawn = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, *a, **k: drawn.update(
        labels=[t.get_text() for t in fig.axes[0].get_legend().get_texts()], texts=[t.get_text() for t in fig.texts]))
    plots.conservation(summary, {"lrp": True, "attention": False}, tmp_path / "c.png")
    plt.close("all")
    # shares 0.5, 0.75, 0.9: the median is 0.75; the failed row is left out; attention is not additive
    assert drawn["labels"] == ["lrp (median per item Σ R / logit 0.75)", "Σ R = logit"]
    assert drawn["texts"] == [plots.UNDER_THE_DIAGONAL] and "rulegraph audit" in plots.UNDER_THE_DIAGONAL


def test_the_scatter_writes_a_png(tmp_path):
    summary = SimpleNamespace(table={"gi": {}}, rows=[{"method": "gi", "logit": 1.0, "relevance_sum": 0.8}])
    plots.conservation(summary, {"gi": True}, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_shares_are_per_item_not_a_ratio_of_totals():
    """One item with a large logit must not speak for the others: per item 0.5, −1 and 0.9 (median
    0.5, one under half), while the totals' ratio would be (50 − 1 + 0.9) / (100 + 1 + 1) ≈ 0.49."""
    from rulegraph.evaluate.plots import token_shares
    from rulegraph.evaluate.summary import conservation
    rows = [{"method": "lrp", "logit": 100.0, "relevance_sum": 50.0}, {"method": "lrp", "logit": 1.0, "relevance_sum": -1.0},
            {"method": "lrp", "logit": 1.0, "relevance_sum": 0.9}, {"method": "lrp", "logit": 0.0, "relevance_sum": 0.3},
            {"method": "lrp", "error": "boom"}, {"method": "attention", "logit": 1.0, "relevance_sum": 1.0}]
    assert token_shares(rows, "lrp") == [-1.0, 0.5, 0.9]
    summary = SimpleNamespace(table={"lrp": {}, "attention": {}}, rows=rows)
    assert conservation(summary, {"lrp": True, "attention": False}) == {
        "lrp": {"median_token_share": 0.5, "n": 3, "under_half": 1}}
