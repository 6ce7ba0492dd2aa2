"""Figures (matplotlib): an explanation's tokens as coloured bars, a generation's matrix as a
heatmap, an image's relevance beside the image. ``Explanation.plot``, ``Generation.plot`` and
``rulegraph explain --png`` use the same functions. matplotlib is imported when a figure is made."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .colour import POSITIVE, NEGATIVE, explained_name, token_texts


def _pyplot():
    import matplotlib
    if matplotlib.get_backend().lower() not in ("agg",) and not _interactive():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _interactive() -> bool:
    import sys
    return "ipykernel" in sys.modules


def save_png(fig) -> bytes:
    """``fig`` as PNG bytes, then closed."""
    import io
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def save(fig, path: str | Path) -> Path:
    """``fig`` as a PNG at ``path`` (its folder made; written whole, never through a link), then closed."""
    from ..files import save_figure
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return save_figure(fig, path, "the picture", dpi=100, bbox_inches="tight")
    finally:
        _pyplot().close(fig)


def explanation_figure(e, item: int = 0, ax=None):
    """Each token's score as a bar (red for the explained output, blue against), the tokens on the
    axis; the title says what was explained. Returns the figure."""
    plt = _pyplot()
    key = next(iter(e.relevance))
    scores = e.scores(key, item)
    tokens = [t.strip() or repr(t) for t in token_texts(e, item, len(scores))]
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(2 + 0.45 * len(tokens), 16), 3.2))
    else:
        fig = ax.figure
    colours = [tuple(c / 255 for c in (POSITIVE if s >= 0 else NEGATIVE)) for s in scores]
    ax.bar(range(len(scores)), scores, color=colours)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(tokens)), tokens, rotation=60, ha="right", fontsize=9)
    ax.set_ylabel("relevance")
    ax.set_title(f"{e.method}: {explained_name(e, item)} = {e.output_value[item]:.4g}", fontsize=10)
    return fig


def generation_figure(g, title: str = "", ax=None):
    """The matrix as a heatmap: red for, blue against, each column scaled to its largest |relevance|,
    grey where a row is not an input of the step; each column headed by its step's number over its
    token, unrotated. Drawn into ``ax`` when given; returns the figure."""
    import matplotlib
    import numpy as np

    from .colour import scales
    plt = _pyplot()
    headers, matrix = g.drawn()
    m = matrix.numpy() / np.array(scales(g))[None, :]
    rows, cols = m.shape
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(2 + 0.6 * cols, 14), min(1.5 + 0.22 * rows, 40)))
    else:
        fig = ax.figure
    cmap = matplotlib.colormaps["bwr"].with_extremes(bad="#eeeeee")
    shown = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    every = max(1, rows // 60)
    labels = [t.strip() or repr(t) for t in g.rows]
    ax.set_yticks(range(0, rows, every), [labels[r] for r in range(0, rows, every)], fontsize=8)
    ax.set_xticks(range(cols), [f"{n}\n{t.strip() or repr(t)}" for n, _, t in (h.partition(" ") for h in headers)], rotation=0,
                  fontsize=8)
    if g.groups and g.groups[-1] != g.groups[0]:
        ax.axhline(g.groups.index(g.groups[-1]) - 0.5, color="black", linewidth=0.8)
    if g.span is not None:                          # the span's column: the steps taken together
        ax.axvline(len(g.steps) - 0.5, color="black", linewidth=0.8)
    ax.set_xlabel("generated token")
    ax.set_ylabel(" and ".join(dict.fromkeys(g.groups)) + " tokens")
    ax.set_title(title or f"{g.method}: relevance per generated token", fontsize=10)
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04, label="relevance / column's max |relevance|")
    return fig


def explanation_image_figure(e, item: int = 0, ax=None):
    """An image explanation's figure (:func:`image_figure`): batch item ``item``'s first image input,
    de-normalised as it was preprocessed, titled with what was explained; into ``ax`` (the relevance
    panel alone) when given."""
    from ..image import IMAGENET_MEAN, IMAGENET_STD
    from ..image import is_image
    key = next(k for k, v in e.boundary.items() if is_image(v))
    mean, std = e.normalization or (IMAGENET_MEAN, IMAGENET_STD)
    pixels = e.pixels.get(key)
    return image_figure(e.boundary[key], pixels, mean=mean, std=std, title=explained_name(e, item), item=item, ax=ax)


def explanation_audio_figure(e, item: int = 0):
    """A clip's explanation (``e.extra["audio"]``) as :func:`audio_figure` draws it: batch item ``item``'s
    relevance over time under its waveform (``e.clip``), titled with what was explained."""
    key, per_second = e.extra["audio"]["input"], e.extra["audio"]["per_second"]
    return audio_figure(e.boundary[key], e.clip.get(key), per_second, title=f"{e.method}: {explained_name(e, item)}",
                        item=item)


def audio_figure(relevance, clip=None, rate: float = 16_000, *, title: str = "", item: int = 0, spans: int = 200):
    """A clip's relevance over time: the waveform (when ``clip`` is given) on a background coloured by the
    relevance of each of ``spans`` equal spans of time (red positive, blue negative, symmetric scale), and
    those sums as bars below; batch item ``item``. For log-mel features (``relevance`` ``[batch, mel bins,
    frames]``, ``rate`` their frames per second) the top panel is the relevance per mel bin and frame over the
    spectrogram. Returns the figure."""
    import numpy as np

    from ..audio import bins, over_time
    plt = _pyplot()
    per_item = relevance[item].detach().double().cpu()
    r, _ = over_time(per_item)
    spans_ = bins(r, rate, spans)
    starts = np.array([a for a, _, _ in spans_])
    widths = np.array([b - a for a, b, _ in spans_])
    sums = np.array([s for _, _, s in spans_])
    bound = float(np.abs(sums).max()) or 1.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.2), sharex=True, height_ratios=(3, 2))
    colours = plt.get_cmap("bwr")((sums / bound + 1) / 2)
    if per_item.dim() == 2:                 # a spectrogram: relevance per mel bin and frame
        heat = per_item.numpy()
        limit = float(np.abs(heat).max()) or 1.0
        extent = (0, heat.shape[1] / rate, 0, heat.shape[0])
        if clip is not None:
            top.imshow(clip[item].detach().double().cpu().numpy(), aspect="auto", origin="lower", cmap="gray",
                       extent=extent)
        top.imshow(heat, aspect="auto", origin="lower", cmap="bwr", vmin=-limit, vmax=limit, extent=extent,
                   alpha=0.6 if clip is not None else 1.0)
        top.set_ylabel("mel bin")
    else:                                   # a waveform over its spans' colours
        for x0, w, c in zip(starts, widths, colours):
            top.axvspan(x0, x0 + w, color=c, alpha=0.6, linewidth=0)
        if clip is not None:
            wave = clip[item].reshape(-1).detach().double().cpu().numpy()
            top.plot(np.arange(wave.size) / rate, wave, color="black", linewidth=0.4)
            top.set_ylabel("waveform")
        else:
            top.set_yticks([])
    top.set_title(title or "relevance over time")
    bottom.bar(starts, sums, width=widths, align="edge", color=colours, edgecolor="none")
    bottom.axhline(0, color="grey", linewidth=0.5)
    bottom.set_ylabel(f"Σ relevance per {widths.mean() * 1e3:.0f} ms")
    bottom.set_xlabel("time (s)")
    bottom.set_xlim(0, r.numel() / rate)
    fig.tight_layout()
    return fig


def image_figure(relevance, image=None, *, mean: Sequence[float], std: Sequence[float], title: str = "",
                 item: int = 0, ax=None):
    """The per-pixel relevance (red positive, blue negative, symmetric scale), beside the
    de-normalised input image and as an overlay on it when ``image`` is given; batch item ``item``,
    whatever the layout (NCHW, NHWC, CHW, HWC: :func:`rulegraph.image.image_axes`). Each panel has
    the image's aspect ratio. With ``ax``, the relevance panel alone, drawn into it. Returns the figure."""
    import numpy as np
    import torch

    from ..image import pixel_map, to_chw
    plt = _pyplot()
    heat = pixel_map(relevance, item)
    bound = float(np.abs(heat).max()) or 1.0
    if ax is not None:
        image, fig, axes = None, ax.figure, [[ax]]
    else:
        panels = 3 if image is not None else 1
        aspect = heat.shape[0] / heat.shape[1]                        # H / W
        width = 4 if aspect <= 1 else max(1.5, 4 / aspect)
        fig, axes = plt.subplots(1, panels, figsize=(width * panels, max(1.2, width * aspect) + 0.6), squeeze=False)
    if image is not None:
        x = to_chw(image.detach().double().cpu(), item)
        channels = x.shape[0]
        m, s = (torch.tensor(v, dtype=x.dtype) for v in (mean, std))
        if len(m) != channels:                    # a grey image under R, G, B values: their mean
            m, s = m.mean().expand(channels), s.mean().expand(channels)
        x = x * s.reshape(-1, 1, 1) + m.reshape(-1, 1, 1)
        picture = x.clamp(0, 1).permute(1, 2, 0).numpy()
        picture = picture[..., 0] if channels == 1 else picture
        axes[0][0].imshow(picture, cmap="gray" if channels == 1 else None, vmin=0, vmax=1)
        axes[0][0].set_title("input")
        axes[0][1].imshow(picture)
        axes[0][1].imshow(heat, cmap="bwr", vmin=-bound, vmax=bound, alpha=0.55)
        axes[0][1].set_title("overlay")
    ax = axes[0][-1]
    shown = ax.imshow(heat, cmap="bwr", vmin=-bound, vmax=bound)
    ax.set_title(title or "relevance")
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    for a in axes[0]:
        a.axis("off")
    return fig
