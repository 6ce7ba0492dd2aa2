"""The demo: explain a few movie-review sentences with the LRP (AH+LN) rules.

    make demo            # or: python examples/sentiment/demo.py [--rules NAME] [--text "…"]

Builds the model on first use (fine-tunes all-MiniLM-L6-v2 on Rotten Tomatoes and
exports it to ONNX: about three minutes in all on a quiet 2-core machine, the fine-tuning
about two; see train.py), then runs
``rulegraph explain`` on it: coloured tokens, the explained logit and the
conservation summary per sentence, the per-layer audit of the first, and an HTML
heatmap page next to the cached model. Each long step says how long it took; logged to a
file, the fine-tuning prints a progress line every 10 % (or 30 s) instead of a bar.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from progress import phase
from train import ensure_model

SENTENCES = [
    "a gorgeous , witty , seductive movie .",
    "the plot is thin and the jokes fall flat .",
    "not a bad film , just a forgettable one .",
    "an intelligent , moving and beautifully acted drama about grief .",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", default="lrp-ah-ln", help="rule set (default: lrp-ah-ln)")
    parser.add_argument("--text", action="append", help="a sentence to explain (repeatable; default: four examples)")
    args = parser.parse_args(argv)
    console = Console()
    model = ensure_model(console=console)
    from rulegraph.cli import main as rulegraph

    texts = args.text or SENTENCES
    page = Path(model).parent / "demo.html"
    console.rule(f"rulegraph explain {model} --rules {args.rules}")
    with phase(console, f"Explaining {len(texts)} sentence(s)", "Explained"):
        code = rulegraph(["explain", str(model), "--rules", args.rules, *[a for t in texts for a in ("--text", t)],
                          "--html", str(page), "--force"])
    if code:
        return code
    console.rule(f"rulegraph audit (per layer) — {texts[0]!r}")
    with phase(console, "Auditing layer by layer", "Audited"):
        code = rulegraph(["audit", str(model), "--rules", args.rules, "--text", texts[0], "--top", "8"])
    console.print(f"\nheatmap page: {page}")
    return code


if __name__ == "__main__":
    sys.exit(main())
