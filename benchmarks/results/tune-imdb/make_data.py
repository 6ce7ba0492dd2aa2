"""Write the texts of the IMDB tune benchmark: N held-out IMDB reviews, from the FIRST-th on.

The held-out part is the one the IMDB MiniLM (``examples/sentiment/train_imdb.py``) never trained
on and that ``examples/sentiment/evaluate.py imdb`` reads: ``data.imdb(seed=0)``'s test split
(5,000 reviews, a seeded stratified shuffle), N of them in order from FIRST (default 0: the first
N, as the evaluation's "first 200 held-out reviews"). Deterministic: the same N and FIRST give the
same file byte for byte.

    .venv/bin/python benchmarks/results/tune-imdb/make_data.py N OUT.csv [FIRST]
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "sentiment"))
import data  # noqa: E402

n, out = int(sys.argv[1]), Path(sys.argv[2])
first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
_, test = data.imdb(seed=0)
chosen = test[first:first + n]
out.parent.mkdir(parents=True, exist_ok=True)
with out.open("w", newline="", encoding="utf-8") as handle:
    writer = csv.writer(handle)
    writer.writerow(["text", "label"])
    writer.writerows(chosen)
print(f"{out}: {len(chosen)} of {len(test)} held-out reviews, from the {first}-th")
