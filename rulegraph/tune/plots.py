"""The trials drawn: the metric on the tune part against each sampled parameter (one panel each,
at most :data:`PANELS`), the chosen trial ringed, flagged trials as crosses."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..files import save_figure  # noqa: E402

#: the most parameters drawn (the space's first ones)
PANELS = 6


def trials_plot(rows: list[dict], names: list[str], metric: str, path: Path) -> Path:
    """``path``: the metric of each complete trial against each parameter in ``names`` (trials that did
    not sample a parameter, e.g. of another rule, are left out of its panel)."""
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    shown = [n for n in names if any(r.get(f"param.{n}") is not None for r in done)][:PANELS] or ["trial"]
    cols = min(3, len(shown))
    fig, axes = plt.subplots(math.ceil(len(shown) / cols), cols, figsize=(4.2 * cols, 3.4 * math.ceil(len(shown) / cols)),
                             squeeze=False)
    for ax, name in zip(axes.flat, shown):
        key = "trial" if name == "trial" else f"param.{name}"
        mine = [r for r in done if r.get(key) is not None]
        xs = [r[key] for r in mine]
        categorical = any(isinstance(x, str) for x in xs)
        if categorical:
            levels = sorted(set(map(str, xs)))
            xs = [levels.index(str(x)) for x in xs]
            ax.set_xticks(range(len(levels)), levels, rotation=20)
        elif xs and min(xs) > 0 and max(xs) / min(xs) > 100:
            ax.set_xscale("log")
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
