"""Write the texts of the tune benchmark: the first N held-out Rotten Tomatoes sentences.

The held-out part is the one the demo model never trained on and that
``examples/sentiment/evaluate.py rt`` reads: ``data.rotten_tomatoes(seed=0)``'s
test split (1,706 sentences, a seeded stratified shuffle), its first N in order.
Deterministic: the same N gives the same file byte for byte.

    .venv/bin/python benchmarks/results/tune-demo/make_data.py N OUT.csv
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "sentiment"))
import data  # noqa: E402

n, out = int(sys.argv[1]), Path(sys.argv[2])
_, test = data.rotten_tomatoes(seed=0)
out.parent.mkdir(parents=True, exist_ok=True)
with out.open("w", newline="", encoding="utf-8") as handle:
    writer = csv.writer(handle)
    writer.writerow(["text", "label"])
    writer.writerows(test[:n])
print(f"{out}: {min(n, len(test))} of {len(test)} held-out sentences")
