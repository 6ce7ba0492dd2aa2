"""The trials drawn: the metric on the tune part against each sampled parameter (one panel each,
at most :data:`PANELS`), the chosen trial ringed, flagged trials as crosses. A ``zero-or-log`` parameter
is one panel: its trials at 0 drawn left of its log axis, at a tick marked 0."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..files import save_figure  # noqa: E402

#: the most parameters drawn (the space's first ones)
PANELS = 6


def panels(done: list[dict], names: list[str]) -> list[str]:
    """The parameters drawn, a panel each: those some finished trial sampled, a ``zero-or-log`` one's
    ``.zero`` choice drawn in its value's panel; at most :data:`PANELS` (``["trial"]`` where none)."""
    shown = [n for n in names if not n.endswith(".zero") and
             any(r.get(f"param.{n}") is not None or r.get(f"param.{n}.zero") is True for r in done)]
    return shown[:PANELS] or ["trial"]


def trials_plot(rows: list[dict], names: list[str], metric: str, path: Path) -> Path:
    """``path``: the metric of each complete trial against each parameter in ``names`` (trials that did
    not sample a parameter, e.g. of another rule, are left out of its panel)."""
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    zeroed = {n.removesuffix(".zero") for n in names if n.endswith(".zero")}
    shown = panels(done, names)
    cols = min(3, len(shown))
    fig, axes = plt.subplots(math.ceil(len(shown) / cols), cols, figsize=(4.2 * cols, 3.4 * math.ceil(len(shown) / cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, shown):
        key = "trial" if name == "trial" else f"param.{name}"
        mine = [r for r in done if r.get(key) is not None]
        xs = [r[key] for r in mine]
        zeros = [r for r in done if name in zeroed and r.get(f"{key}.zero") is True]
        categorical = any(isinstance(x, str) for x in xs)
        if categorical:
            levels = sorted(set(map(str, xs)))
            xs = [levels.index(str(x)) for x in xs]
            ax.set_xticks(range(len(levels)), levels, rotation=20)
        elif name in zeroed or (xs and min(xs) > 0 and max(xs) / min(xs) > 100):
            ax.set_xscale("log")
        if zeros:           # γ = 0 has no place on a log axis: a tick of its own, left of the smallest value
            at = min(xs, default=1e-3) / 10
            low, high = math.ceil(math.log10(at * 3)), math.floor(math.log10(max(xs, default=at)))
            decades = [10.0 ** k for k in range(low, high + 1)]
            mine, xs = zeros + mine, [at] * len(zeros) + xs
            ax.axvline(at * 3, color="0.7", lw=0.8)
            ax.set_xticks([at, *decades], ["0", *(f"{t:g}" for t in decades)])
        for x, r in zip(xs, mine):
            ax.scatter([x], [r["value"]], marker="x" if r.get("flag") else "o", color="C3" if r.get("flag") else "C0",
                       s=28, zorder=2)
            if r.get("chosen"):
                ax.scatter([x], [r["value"]], s=140, facecolors="none", edgecolors="k", zorder=3)
        ax.set_xlabel(name)
        ax.set_ylabel(f"{metric} (tune)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.set_visible(False)
    fig.suptitle(f"{metric} per trial (ringed: chosen on validation; ×: flagged by the conservation audit)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, path.name, dpi=110)
    plt.close(fig)
    return path
