"""Paired differences between methods on the same texts, with bootstrap intervals.

    python examples/sentiment/paired.py rt     # reads docs/evaluation/rt-results.jsonl.gz
    python examples/sentiment/paired.py imdb   # imdb-results.jsonl.gz and imdb-rest-results.jsonl.gz

The table of ``docs/evaluation/<part>-table.md`` gives each method's mean with its own interval;
two methods whose intervals overlap can still differ reliably, since every text is scored by
both. This script takes, per text, method A's metric minus method B's, and reports the mean
difference with its 95% percentile-bootstrap interval (``rulegraph.evaluate.paired``, the
bootstrap of ``rulegraph evaluate --paired`` and ``rulegraph compare``: the runner's, same seed,
over the texts in order), for the comparisons the Mask-LRP paper makes (Song et al., 2024): Mask-LRP against
LRP(AH+LN) and AttnLRP, and against its random-mask control; and the decomposition against
LRP(AH+LN), LRP(AH+LN) against LRP(AH). A part evaluated in several runs (IMDB: ``imdb`` and
``imdb-rest``, see ``evaluate.py --name``) is read from all of them: they score the same texts.
It writes ``docs/evaluation/<part>-paired.md``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rulegraph.evaluate import paired

DOCS = Path(__file__).resolve().parents[2] / "docs" / "evaluation"
#: (A, B): the table reports A − B
PAIRS = [("mask-lrp-rollout", "lrp-ah-ln"), ("mask-lrp-rollout", "attnlrp"), ("mask-lrp-rollout", "mask-lrp-random"),
         ("attnlrp", "lrp-ah-ln"), ("decomposition", "lrp-ah-ln"), ("lrp-ah-ln", "lrp-ah"), ("gae", "rollout"),
         ("lat", "rollout")]
#: The runs of each part (their results files' prefixes).
RUNS = {"rt": ["rt"], "imdb": ["imdb", "imdb-rest"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=list(RUNS))
    part = parser.parse_args().part
    rows = paired.read_results(DOCS / f"{run}-results.jsonl.gz" for run in RUNS[part])
    methods = {r["method"] for r in rows}
    pairs = [(a, b) for a, b in PAIRS if a in methods and b in methods]
    result = paired.table(rows, pairs, paired.metric_names(rows), seed=0)
    text = f"({part}) " + paired.CAPTION + "\n\n" + paired.markdown(result)
    out = DOCS / f"{part}-paired.md"
    out.write_text(text + "\n")
    print(text)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
