"""PNG figures of an evaluation: mean perturbation curves per method, and the conservation
scatter (explained logit vs Σ relevance per example, one colour per method; Ali et al. 2022 Fig. 3),
labelled with the median of the per-item shares (:func:`token_shares`).

What is drawn how comes from declarations: a panel's title is the metric's ``title`` and
direction, its axis the metric's ``x_label``; methods declared ``reference`` (random scores,
attention weights) are dashed, and the scatter shows the methods declared ``additive``."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..files import save_figure  # noqa: E402


def token_shares(rows: list[dict], method: str) -> list[float]:
    """Per explained item of ``method``, the share of its own explained value its tokens carry
    (Σ R over its tokens / its explained logit), sorted; failed items and a logit of 0 left out.
    Per item, never a ratio of totals: one item with a large logit must not speak for the rest."""
    mine = [r for r in rows if r["method"] == method and "error" not in r]
    return sorted(r["relevance_sum"] / r["logit"] for r in mine if r["logit"])


def _colours(methods):
    cmap = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(methods)}


def curves(summary, metrics, path: Path, reference: dict[str, bool] | None = None, title: str = "") -> None:
    shown = [m for m in metrics if m.name in summary.curves]
    if not shown:
        return
    methods = list(summary.table)
    colours = _colours(methods)
    cols = min(3, len(shown))
    rows = (len(shown) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, shown):
        xs = metric.xs()
        for method in methods:
            ys = summary.curves[metric.name].get(method)
            if ys is not None:
                ax.plot(xs, ys, label=method, color=colours[method], lw=1.4,
                        ls="--" if (reference or {}).get(method) else "-")
        ax.set_title(f"{metric.title or metric.name}  {metric.direction()}", fontsize=9)
        ax.set_xlabel(metric.x_label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(title or f"perturbation curves, mean over {summary.n_examples} examples", fontsize=10)
    fig.tight_layout(rect=(0, 0.06 + 0.02 * ((len(labels) - 1) // 6), 1, 0.97))
    try:
        save_figure(fig, path, path.name, dpi=90)
    finally:
        plt.close(fig)


#: the scatter's caption: why a rule set that conserves need not sit on the diagonal
UNDER_THE_DIAGONAL = ("Σ R over tokens = logit − what biases, position embeddings and LayerNorm β absorb − what a "
                      "rule breaks by design (e.g. AttnLRP's softmax) − relevance at other inputs (token types): "
                      "off the diagonal is not a conservation error; `rulegraph audit` books each part.")


def conservation(summary, additive: dict[str, bool], path: Path, title: str = "") -> None:
    methods = [m for m in summary.table if additive.get(m)]
    if not methods:
        return
    colours = _colours(list(summary.table))
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    lo, hi = 0.0, 0.0
    for method in methods:
        rows = [r for r in summary.rows if r["method"] == method and "error" not in r]   # failed rows have no logit
        x = [r["logit"] for r in rows]
        y = [r["relevance_sum"] for r in rows]
        shares = token_shares(summary.rows, method)
        label = f"{method} (median per item Σ R / logit {shares[len(shares) // 2]:.2f})" if shares else method
        ax.scatter(x, y, s=7, alpha=0.55, color=colours[method], label=label, edgecolors="none")
        lo, hi = min([lo, *x, *y]), max([hi, *x, *y])
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8, ls=":", label="Σ R = logit")
    ax.set_xlabel("explained logit f(x)")
    ax.set_ylabel("Σ relevance over tokens")
    ax.set_title(title or "conservation per example", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, markerscale=2)
    fig.text(0.01, 0.01, UNDER_THE_DIAGONAL, fontsize=6, color="#444444", wrap=True)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    try:
        save_figure(fig, path, path.name, dpi=90)
    finally:
        plt.close(fig)
