"""Paired differences between methods on the same texts, with bootstrap intervals.

    python examples/sentiment/paired.py rt     # reads docs/evaluation/rt-results.jsonl.gz
    python examples/sentiment/paired.py imdb   # imdb-results.jsonl.gz and imdb-rest-results.jsonl.gz

The table of ``docs/evaluation/<part>-table.md`` gives each method's mean with its own interval;
two methods whose intervals overlap can still differ reliably, since every text is scored by
both. This script takes, per text, method A's metric minus method B's, and reports the mean
difference with its 95% percentile-bootstrap interval (the runner's :func:`bootstrap`, same
seed), for the comparisons the Mask-LRP paper makes (Song et al., 2024): Mask-LRP against
LRP(AH+LN) and AttnLRP, and against its random-mask control; and the decomposition against
LRP(AH+LN), LRP(AH+LN) against LRP(AH). A part evaluated in several runs (IMDB: ``imdb`` and
``imdb-rest``, see ``evaluate.py --name``) is read from all of them: they score the same texts.
It writes ``docs/evaluation/<part>-paired.md``.
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from rulegraph.evaluate.summary import bootstrap

DOCS = Path(__file__).resolve().parents[2] / "docs" / "evaluation"
#: (A, B): the table reports A − B
PAIRS = [("mask-lrp-rollout", "lrp-ah-ln"), ("mask-lrp-rollout", "attnlrp"), ("mask-lrp-rollout", "mask-lrp-random"),
         ("attnlrp", "lrp-ah-ln"), ("decomposition", "lrp-ah-ln"), ("lrp-ah-ln", "lrp-ah"), ("gae", "rollout"),
         ("lat", "rollout")]
#: The runs of each part (their results files' prefixes).
RUNS = {"rt": ["rt"], "imdb": ["imdb", "imdb-rest"]}
#: metric → higher is better
METRICS = {"aopc": True, "lodds": False, "auac": True, "au-mse": False, "hiding": False, "revealing": True,
           "word-deletion": False}


def paired(rows: list[dict], a: str, b: str, metric: str, seed: int = 0) -> tuple[float, float, float, int]:
    """Mean of A − B over the texts both methods scored, its interval, and how many texts."""
    by = {(r["example"], r["method"]): r["metrics"].get(metric) for r in rows if "error" not in r}
    diffs = [by[(i, a)] - by[(i, b)] for (i, m) in by if m == a and by.get((i, b)) is not None
             and by[(i, a)] is not None]
    return (*bootstrap(diffs, seed), len(diffs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=list(RUNS))
    part = parser.parse_args().part
    rows = []
    for run in RUNS[part]:
        with gzip.open(DOCS / f"{run}-results.jsonl.gz", "rt", encoding="utf-8") as f:
            rows += [json.loads(line) for line in f]
    methods = {r["method"] for r in rows}
    lines = [f"Paired differences A − B per text ({part}), mean [95% bootstrap interval]; "
             "↑/↓: higher/lower is better, so a difference on the better side favours A. "
             "Texts: those both methods scored (a metric undefined on a text, e.g. word deletion on a "
             "text of fewer words, leaves it out of that column).", "",
             "| A − B | texts | " + " | ".join(f"{m} {'↑' if up else '↓'}" for m, up in METRICS.items()) + " |",
             "|---|---:|" + "---|" * len(METRICS)]
    for a, b in PAIRS:
        if a not in methods or b not in methods:
            continue
        cells, counts = [], set()
        for metric in METRICS:
            mean, low, high, n = paired(rows, a, b, metric)
            cells.append(f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]")
            counts.add(n)
        texts = f"{min(counts)}–{max(counts)}" if len(counts) > 1 else str(counts.pop())
        lines.append(f"| {a} − {b} | {texts} | " + " | ".join(cells) + " |")
    out = DOCS / f"{part}-paired.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
