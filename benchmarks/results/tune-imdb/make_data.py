"""Write the texts of the IMDB tune benchmark: N held-out IMDB reviews, from the FIRST-th on.

The held-out part is the one the IMDB MiniLM (``examples/sentiment/train_imdb.py``) never trained
on and that ``examples/sentiment/evaluate.py imdb`` reads: ``data.imdb(seed=0)``'s test split
(5,000 reviews, a seeded stratified shuffle), N of them in order from FIRST (default 0: the first
N, as the evaluation's "first 200 held-out reviews"). Deterministic: the same N and FIRST give the
same file byte for byte.

    .venv/bin/python benchmarks/results/tune-imdb/make_data.py N OUT.csv [FIRST]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tune-demo"))
from make_data import data, write  # noqa: E402  (the demo benchmark's writer, and examples/sentiment/data.py)

write(data.imdb(seed=0)[1], Path(sys.argv[2]), int(sys.argv[1]), int(sys.argv[3]) if len(sys.argv) > 3 else 0,
      "reviews")
